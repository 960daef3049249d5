"""The demo draft's recipe on tiny models: copy layers, train adapters, save, reassemble, evaluate."""

import pytest
import torch

from shared.models.distill import draft as draft_lib
from shared.models.distill.evaluate import agreement, chain_stats
from shared.models.tiny import build_tiny


@pytest.fixture
def target():
    return build_tiny("llama", vocab_size=96, seed=0, num_layers=4).eval()


def _ids():
    return torch.tensor([[5, 17, 3, 88, 41, 9, 60, 2]])


def test_copied_layers_start_as_the_target_when_all_are_copied(target):
    draft = draft_lib.copy_layers(target, [0, 1, 2, 3])
    with torch.no_grad():
        torch.testing.assert_close(draft(input_ids=_ids()).logits, target(input_ids=_ids()).logits)


def test_adapter_round_trip_rebuilds_the_trained_draft(target, tmp_path):
    spec = draft_lib.DraftSpec(layer_ids=[0, 3], lora_rank=4, lora_alpha=4.0)
    draft = draft_lib.copy_layers(target, spec.layer_ids)
    params = draft_lib.add_adapters(draft, spec)
    assert all(p.requires_grad for p in params)
    assert not draft.model.embed_tokens.weight.requires_grad  # shared with the target, frozen
    with torch.no_grad():  # stand-in for training; fp16-representable so the saved file is exact
        for p in params:
            p.copy_((torch.randn_like(p) * 0.1).half().float())
        trained = draft(input_ids=_ids()).logits
    path = tmp_path / "adapter.safetensors"
    draft_lib.save_adapter(path, draft, spec, draft_lib.target_fingerprint(target), {"note": "test"}, vocab_ids=[1, 2, 3])
    assert draft_lib.adapter_vocab(path) == [1, 2, 3]

    rebuilt = draft_lib.assemble(target, path)
    assert not any(isinstance(m, draft_lib.LoRALinear) for m in rebuilt.modules())  # merged into plain linears
    with torch.no_grad():
        torch.testing.assert_close(rebuilt(input_ids=_ids()).logits, trained, atol=1e-4, rtol=1e-4)

    other = build_tiny("llama", vocab_size=96, seed=7, num_layers=4)
    with pytest.raises(ValueError, match="fingerprint"):
        draft_lib.assemble(other, path)


def test_chain_statistics_follow_runs_of_agreement():
    agree, per = agreement([[1, 2, 3, 4, 5, 6]], [[1, 2, 0, 4, 5, 6]])
    assert agree == pytest.approx(5 / 6)
    # k=2 over agree 1 1 0 1 1 1: [1 1]→2+bonus (pos 3), [1 1]→2+bonus (pos 6): 4 accepted of 4 proposed, 2 steps
    stats = chain_stats(per, 2)
    assert stats.acceptance_rate == pytest.approx(1.0) and stats.tokens_per_step == pytest.approx(3.0)
    # k=4: [1 1 0 ..]→2 accepted+bonus at pos 2 (4 proposed), then [1 1 1]→3 of 3: 5/7 accepted, 2 steps
    stats = chain_stats(per, 4)
    assert stats.acceptance_rate == pytest.approx(5 / 7) and stats.tokens_per_step == pytest.approx(3.5)
