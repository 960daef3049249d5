"""The fused decoder (shared/engine/fused) against the transformers modules it replaces, through ModelRunner.

Same weights, same paged cache and backend: prefill, decode, chain and tree verify give the
transformers path's logits within each dtype's tolerance (on this project's CPUs the very
same bits); early exit, feature capture and offload work on it; other architectures fall back.
"""

from __future__ import annotations

import pytest
import torch

from shared.engine import fused
from shared.engine.attention.kv_store import store_kv
from shared.engine.config import EngineConfig
from shared.engine.runner import ModelRunner, Work
from shared.engine.weight_moves import relocate
from shared.models.tiny import build_tiny

from conftest import Reference, make_runner

TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=0.0, atol=0.1)}
PROMPT = list(range(2, 41))  # 39 tokens: several KV blocks of 4


def steps(runner: ModelRunner) -> list[torch.Tensor]:
    """Logits of a prefill, a decode, a chain verify, a tree verify and a batch of two, in that order."""
    seq = runner.add("a", PROMPT)
    out = [runner.forward([Work(seq, want_root=True)]).logits]  # prefill: [1, V]
    runner.commit(seq, [5])
    out.append(runner.forward([Work(seq, want_root=True)]).logits)  # decode
    chain = [(7, -1), (8, 0), (9, 1), (10, 2)]
    out.append(runner.forward([Work(seq, new_nodes=chain, want_root=True, want_nodes=True)]).logits)
    runner.commit(seq, [7, 8])
    tree = [(11, -1), (12, 0), (13, 0), (14, 1), (15, -1)]
    out.append(runner.forward([Work(seq, new_nodes=tree, want_root=True, want_nodes=True)]).logits)
    runner.commit(seq, [11, 13])
    other = runner.add("b", PROMPT[:17])
    both = [Work(seq, new_nodes=chain[:2], want_root=True, want_nodes=True), Work(other, want_root=True)]
    out.append(runner.forward(both).logits)  # a verify beside a prefill
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_fused_logits_are_the_transformers_paths(tiny_family, dtype):
    hf = make_runner(build_tiny(tiny_family, vocab_size=96).to(dtype), fused_layers=False)
    fz = make_runner(build_tiny(tiny_family, vocab_size=96).to(dtype))
    assert isinstance(fz.decoder, fused.FusedDecoder) and not isinstance(hf.decoder, fused.FusedDecoder)
    for got, want in zip(steps(fz), steps(hf), strict=True):
        torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_fused_logits_match_the_reference_alone(tiny_family):
    """float32, against transformers' own SDPA attention with no paged cache (the ground truth)."""
    model = build_tiny(tiny_family, vocab_size=96)
    reference = Reference(model)
    runner = make_runner(model)
    seq = runner.add("a", PROMPT)
    got = runner.forward([Work(seq, want_root=True, new_nodes=[(7, -1), (8, 0)], want_nodes=True)]).logits
    want = reference.logits(PROMPT + [7, 8])[-3:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_qwen2_biases_and_tied_embeddings_are_kept():
    model = build_tiny("qwen2", vocab_size=96, tie_word_embeddings=True)
    reference = Reference(model)
    runner = make_runner(model)
    attn = runner.decoder.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and runner.lm_head.weight is runner.decoder.embed_tokens.weight
    seq = runner.add("a", PROMPT)
    torch.testing.assert_close(runner.forward([Work(seq, want_root=True)]).root(0), reference.logits(PROMPT)[-1],
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_the_transformers_model_reads_its_weights_from_the_merged_ones():
    """No second copy of the projections: q/k/v and gate/up are views of the merged weights, and the
    transformers model's state_dict is unchanged by building the fused decoder."""
    model = build_tiny("qwen3", vocab_size=96)
    before = Reference(model).logits(PROMPT)
    runner = make_runner(model)
    layer, hf_layer = runner.decoder.layers[1], model.model.layers[1]
    merged = layer.self_attn.qkv_proj.weight
    for proj in (hf_layer.self_attn.q_proj, hf_layer.self_attn.k_proj, hf_layer.self_attn.v_proj):
        assert proj.weight.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()
    gate_up = layer.mlp.gate_up_proj.weight
    assert hf_layer.mlp.up_proj.weight.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
    assert layer.self_attn.o_proj.weight is hf_layer.self_attn.o_proj.weight
    assert torch.equal(Reference(model).logits(PROMPT), before)  # built from its state_dict: the same weights


def test_a_second_runner_on_the_same_model_gets_the_same_logits():
    model = build_tiny("llama", vocab_size=96)
    first, second = make_runner(model), make_runner(model)
    for a, b in zip(steps(first), steps(second), strict=True):
        assert torch.equal(a, b)


def test_the_rotary_table_holds_the_transformers_values():
    model = build_tiny("llama", vocab_size=96, rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    table = fused.build(model, 300).rotary_emb
    pos = torch.tensor([[0, 5, 17, 299, 3]])
    cos, sin = (t.squeeze(2) for t in table(None, pos))  # [1, T, D]
    want_cos, want_sin = model.model.rotary_emb(torch.empty(0), position_ids=pos)
    torch.testing.assert_close(cos, want_cos, rtol=0, atol=1e-6)
    half = want_sin.shape[-1] // 2
    torch.testing.assert_close(sin, torch.cat([-want_sin[..., :half], want_sin[..., half:]], -1), rtol=0, atol=1e-6)


def test_turned_off_by_config_and_environment(monkeypatch):
    model = build_tiny("llama", vocab_size=96)
    assert not isinstance(make_runner(model, fused_layers=False).decoder, fused.FusedDecoder)
    monkeypatch.setenv("TANDEM_FUSED_LAYERS", "0")
    assert EngineConfig().fused_layers is False
    assert not isinstance(ModelRunner(model, EngineConfig(num_blocks=64)).decoder, fused.FusedDecoder)
    monkeypatch.setenv("TANDEM_FUSED_LAYERS", "1")
    assert EngineConfig().fused_layers is True


def test_other_architectures_run_through_transformers():
    from transformers import GemmaConfig, GemmaForCausalLM

    config = GemmaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256)  # fmt: skip
    torch.manual_seed(0)
    model = GemmaForCausalLM(config).eval().requires_grad_(False)
    assert fused.unsupported_reason(model) is not None
    reference = Reference(model)
    runner = make_runner(model)
    assert runner.decoder is model.get_decoder()
    seq = runner.add("a", PROMPT)
    torch.testing.assert_close(runner.forward([Work(seq, want_root=True)]).root(0), reference.logits(PROMPT)[-1],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    gelu = build_tiny("llama", vocab_size=96, hidden_act="gelu")
    assert "activation" in fused.unsupported_reason(gelu)
    assert not isinstance(make_runner(gelu).decoder, fused.FusedDecoder)


def test_feature_capture_records_the_fused_layers_inputs():
    """Layer id i is the hidden state entering layer i, N the last layer's output: as on transformers' layers."""
    hf = make_runner(build_tiny("llama", vocab_size=96, num_layers=3), fused_layers=False)
    fz = make_runner(build_tiny("llama", vocab_size=96, num_layers=3))
    feats = []
    for runner in (hf, fz):
        seq = runner.add("a", PROMPT)
        feats.append(runner.forward([Work(seq, want_root=True)], feature_layers=(0, 1, 3)).features)
    assert feats[0].shape == (len(PROMPT), 3 * 64)
    torch.testing.assert_close(feats[1], feats[0], rtol=1e-6, atol=1e-6)


def test_one_kv_store_writes_what_two_stores_write():
    rows = torch.randn(3, 4, 2, 4)  # [T, q | k | v | other, Hkv, D], as the merged projection lays them out
    pair = rows[:, 1:3].transpose(0, 1)  # [2, T, Hkv, D]: a view, not a copy
    key, value = rows[:, 1].transpose(0, 1)[None], rows[:, 2].transpose(0, 1)[None]  # [1, Hkv, T, D]
    slots = torch.tensor([7, 0, 3])
    one, two = torch.zeros(2, 10, 2, 4), torch.zeros(2, 10, 2, 4)  # [2, slots, Hkv, D]
    store_kv(one, slots, None, None, pair)
    store_kv(two, slots, key, value)
    assert torch.equal(one, two) and torch.equal(one[1, 7], rows[0, 2])


def test_moving_the_weights_keeps_the_merged_projections_shared():
    """What a draft's offload does (weight_moves.py), with a copy on the same device standing in for the move."""
    model = build_tiny("llama", vocab_size=96, tie_word_embeddings=True)
    runner = make_runner(model)
    want = steps(make_runner(build_tiny("llama", vocab_size=96, tie_word_embeddings=True)))
    merged = runner.decoder.layers[0].self_attn.qkv_proj.weight
    old = merged.untyped_storage().data_ptr()
    tensors = list({id(t): t for m in runner.weight_modules for t in [*m.parameters(), *m.buffers()]}.values())
    relocate(tensors, lambda raw: raw.clone())
    q = model.model.layers[0].self_attn.q_proj.weight
    assert merged.untyped_storage().data_ptr() != old
    assert q.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    for got, expected in zip(steps(runner), want, strict=True):
        assert torch.equal(got, expected)
