"""Training the EAGLE-3 head: training-time test equals drafting, capture semantics, loss goes down."""

from __future__ import annotations

import random

import pytest
import torch

from shared.engine.eagle.model import Eagle3Config, Eagle3Head
from shared.models.distill.generate import Sample
from shared.models.eagle.data import capture_hooks, featurize
from shared.models.eagle.evaluate import chain_acceptance
from shared.models.eagle.train import TrainConfig, draft_vocab, new_head, step_loss, collate, train
from shared.models.eagle.ttt import input_features, unroll
from shared.models.tiny import build_tiny


def small_head() -> Eagle3Head:
    torch.manual_seed(0)
    cfg = Eagle3Config(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                       vocab_size=50, draft_vocab_size=50, target_hidden_size=16, aux_layer_ids=[0, 1, 2])  # fmt: skip
    head = Eagle3Head(cfg)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head.eval()


@torch.inference_mode()
def test_unrolled_steps_equal_drafting_token_by_token():
    """Step s at p must be what the head computes for the s-th draft after the true prefix x_0..x_p."""
    head = small_head()
    b, t = 2, 9
    ids, aux = torch.randint(0, 50, (b, t)), torch.randn(b, t, 48)
    outs = unroll(head, ids, aux, 3)
    feats = input_features(head, aux)
    positions = lambda n: torch.arange(n)[None].expand(b, n)  # noqa: E731
    torch.testing.assert_close(outs[0], head(ids, feats, positions(t)))
    for p in range(t - 2):
        for s in (1, 2):
            seq = ids[:, : p + 1 + s]
            drafted = [outs[j][:, p : p + 1] for j in range(s)]  # the head's own outputs feed the drafts
            ref = head(seq, torch.cat([feats[:, : p + 1], *drafted], 1), positions(p + 1 + s))
            torch.testing.assert_close(ref[:, -1], outs[s][:, p], atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_capture_takes_layer_inputs_and_the_pre_norm_output():
    model = build_tiny("llama", num_layers=3, seed=0)
    store, handles = capture_hooks(model, [0, 2, 3])
    ids = torch.tensor([[5, 6, 7, 8]])
    out = model(ids, output_hidden_states=True)
    for h in handles:
        h.remove()
    torch.testing.assert_close(store[0], out.hidden_states[0])  # the embeddings entering layer 0
    torch.testing.assert_close(store[2], out.hidden_states[2])
    normed = model.model.norm(store[3])
    torch.testing.assert_close(model.lm_head(normed), out.logits)  # id 3 = N: the final norm's input


def test_a_few_updates_lower_the_loss_on_a_tiny_target():
    target = build_tiny("llama", num_layers=3, seed=0, vocab_size=64)
    rng = random.Random(0)
    samples = [Sample([1, 2] + [rng.randrange(64) for _ in range(6)], [rng.randrange(64) for _ in range(10)],
                      torch.zeros(0), torch.zeros(0), False, "chat") for _ in range(6)]  # fmt: skip
    seqs = featurize(target, samples, [1, 2, 3], batch_size=4)
    assert seqs[0].aux.shape == (18, 3 * 64) and seqs[0].aux.dtype == torch.float16
    assert torch.equal(seqs[0].labels, target(seqs[0].ids[None]).logits[0].argmax(-1))
    ids, covered = draft_vocab(seqs, 32)
    assert len(ids) == 32 and 0 < covered <= 1
    head = new_head(target, ids, [1, 2, 3])
    t2d = torch.full((64,), -1, dtype=torch.long)
    t2d[torch.tensor(ids)] = torch.arange(32)
    cfg = TrainConfig(steps=2, lr=3e-3, warmup=1, batch_tokens=64, minutes=1.0, max_updates=40, epochs=100)
    batch = collate(seqs, t2d, cfg.prompt_weight)
    before, _ = step_loss(head, *batch, cfg=cfg)
    report = train(head, seqs, t2d, cfg, progress=lambda msg: None)
    with torch.no_grad():
        after, _ = step_loss(head, *batch, cfg=cfg)
    assert report["updates"] == 40 and float(after) < float(before)
    acc = chain_acceptance(head, seqs, k=3)
    assert acc["positions"] > 0 and 1.0 <= acc["mean_accepted_length"] <= 4.0


class _Tok:
    """The two things generate_features needs of a tokenizer: the chat template's ids and a pad id."""

    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return {"input_ids": [1] + [3 + (ord(c) % 50) for c in messages[-1]["content"]]}


@torch.inference_mode()
def test_one_pass_generation_captures_what_teacher_forcing_computes():
    """Features, argmax labels and top-K soft labels captured during generate equal a teacher-forced forward."""
    from shared.models.distill.corpus import Prompt
    from shared.models.eagle.data import generate_features

    target = build_tiny("llama", num_layers=3, seed=0, vocab_size=64)
    target.generation_config.eos_token_id = 63
    prompts = [Prompt("chat", "hi", False), Prompt("chat", "a longer prompt here", True)]  # left padding differs
    seqs = generate_features(target, _Tok(), prompts, [1, 2, 3], max_new_tokens=7, soft_k=4)
    for s, p in zip(seqs, prompts):
        assert s.heldout == p.heldout and s.num_prompt == 1 + len(p.text)
        ref = featurize(target, [Sample(s.ids[: s.num_prompt].tolist(), s.ids[s.num_prompt :].tolist(),
                                        torch.zeros(0), torch.zeros(0), False, "chat")], [1, 2, 3])[0]  # fmt: skip
        torch.testing.assert_close(s.aux.float(), ref.aux.float(), atol=2e-3, rtol=2e-3)
        answer = slice(s.num_prompt - 1, len(s.ids))
        assert torch.equal(s.labels[answer], ref.labels[answer])  # the target's argmax where it drafts
        assert (s.labels[: s.num_prompt - 1] == -1).all()
        assert torch.equal(s.soft_ids[answer, 0].long(), s.labels[answer])  # top-1 of the soft labels
        assert (s.soft_logp[answer].float() <= 0).all() and s.soft_ids.shape[1] == 4


def test_soft_labels_train_and_prompt_labels_are_masked():
    from shared.models.eagle.data import Sequence

    target = build_tiny("llama", num_layers=3, seed=0, vocab_size=64)
    rng = random.Random(1)
    seqs = []
    for _ in range(4):
        ids = torch.tensor([rng.randrange(64) for _ in range(12)])
        labels = torch.tensor([-1] * 4 + [rng.randrange(64) for _ in range(8)])
        soft_ids = torch.randint(0, 64, (12, 4), dtype=torch.int32)
        soft_ids[:, 0] = labels.clamp(min=0)
        soft_logp = torch.log_softmax(torch.randn(12, 4), -1).to(torch.float16)
        seqs.append(Sequence(ids, torch.randn(12, 3 * 64).half(), labels, 5, False, "chat", soft_ids, soft_logp))
    vocab, _ = draft_vocab(seqs, 48)
    head = new_head(target, vocab, [1, 2, 3])
    t2d = torch.full((64,), -1, dtype=torch.long)
    t2d[torch.tensor(vocab)] = torch.arange(len(vocab))
    ids, aux, labels, weights, soft_ids, soft_p = collate(seqs, t2d, prompt_weight=0.5)
    assert (labels[:, :4] == -1).all()  # no target choice inside the prompt: never a label
    assert torch.allclose(soft_p[:, 4:].sum(-1), torch.ones(4, 8)) and (soft_p[:, :4] == 0).all()
    assert ((soft_ids >= 0) | (soft_p == 0)).all()  # ids outside the draft vocabulary carry no mass
    cfg = TrainConfig(steps=2, lr=3e-3, warmup=1, batch_tokens=64, minutes=1.0, max_updates=30, soft=0.5)
    batch = (ids, aux, labels, weights, soft_ids, soft_p)
    before, _ = step_loss(head, *batch, cfg=cfg)
    train(head, seqs, t2d, cfg, progress=lambda msg: None)
    with torch.no_grad():
        after, _ = step_loss(head, *batch, cfg=cfg)
    assert float(after) < float(before)


def test_training_continues_from_a_committed_head(tmp_path):
    from shared.models.eagle.__main__ import load_trained, save_committed

    target = build_tiny("llama", num_layers=3, seed=0, vocab_size=64)
    head = new_head(target, list(range(0, 64, 2)), [1, 2, 3])
    with torch.no_grad():
        head.fc.weight.add_(1.0)  # "trained"
    save_committed(head, tmp_path, {"command": "test"})
    fresh = new_head(target, list(range(0, 64, 2)), [1, 2, 3])
    load_trained(fresh, tmp_path / "head.safetensors")
    torch.testing.assert_close(fresh.fc.weight, head.fc.weight.half().float())
    torch.testing.assert_close(fresh.embed_tokens.weight, head.embed_tokens.weight)  # the target's, untouched
    other = new_head(target, list(range(1, 64, 2)), [1, 2, 3])  # another draft vocabulary: refused
    with pytest.raises(ValueError, match="draft vocabulary"):
        load_trained(other, tmp_path / "head.safetensors")


def test_decoding_walk_visits_only_the_positions_after_each_bonus_token():
    from shared.models.eagle.evaluate import decoding_walk

    accepted = {0: 3, 1: 0, 2: 0, 3: 0, 4: 0, 5: 1, 6: 0, 7: 0}  # easy at 0 and 5, hard everywhere else
    # the walk: 0 (commits 4) -> 4 (1) -> 5 (2) -> 7 (1) -> 8 = n - 1: 8 tokens in 4 steps
    assert decoding_walk(accepted.__getitem__, 0, 9) == (8, 4)
    # averaging every position alike says 1 + 4/8 = 1.5; the walk 2.0 here, lower when misses cluster after misses
    assert decoding_walk(lambda p: 4, 0, 4) == (3, 1)  # the answer's end caps the last step
