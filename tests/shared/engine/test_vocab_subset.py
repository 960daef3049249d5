"""A draft whose LM head covers a vocabulary subset: same logits there, nothing elsewhere, output still lossless."""

import json

import pytest
import torch

from shared.engine import vocab_subset
from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import ModelLoadError
from shared.engine.loading import load_causal_lm
from shared.engine.target_engine import TargetEngine
from shared.engine.types import SpecItem
from shared.models.tiny import build_tiny, save_tiny

from conftest import make_runner
from test_lossless_greedy import NUM_TOKENS, SHAPES, prompts_for, run_sd

SUBSET = list(range(0, 96, 2))  # every even token of the tiny vocabulary


def test_head_matches_full_head_on_the_subset_and_floors_the_rest(draft_model):
    full = draft_model.get_output_embeddings()
    hidden = torch.randn(5, 3, full.weight.shape[1])
    expected = full(hidden)
    head = vocab_subset.SubsetLMHead(full.weight, torch.tensor(SUBSET))
    got = head(hidden)
    assert got.shape == expected.shape
    torch.testing.assert_close(got[..., SUBSET], expected[..., SUBSET])
    rest = [t for t in range(96) if t not in SUBSET]
    assert (got[..., rest] == torch.finfo(got.dtype).min).all()
    assert set(got.argmax(-1).flatten().tolist()) <= set(SUBSET)
    assert torch.softmax(got, -1)[..., rest].max() == 0


@pytest.mark.parametrize("ids", [[], [0, 96], [-1], [3, 3]])
def test_bad_subsets_are_refused(draft_model, ids):
    with pytest.raises(ValueError):
        vocab_subset.SubsetLMHead(draft_model.get_output_embeddings().weight, torch.tensor(ids, dtype=torch.long))


def test_loading_a_directory_with_a_subset_installs_the_head(tmp_path):
    save_tiny(tmp_path / "d", vocab_size=96, seed=1, hidden_size=32, num_layers=1)
    vocab_subset.write(tmp_path / "d", SUBSET, source="test")
    loaded = load_causal_lm(tmp_path / "d", dtype="float32", device="cpu", with_tokenizer=False)
    head = loaded.model.get_output_embeddings()
    assert isinstance(head, vocab_subset.SubsetLMHead)
    assert head.ids.tolist() == SUBSET and loaded.vocab_size == 96

    (tmp_path / "d" / vocab_subset.FILE_NAME).write_text(json.dumps({"ids": [0, 500]}))
    with pytest.raises(ModelLoadError, match="vocab_subset.json"):
        load_causal_lm(tmp_path / "d", dtype="float32", device="cpu", with_tokenizer=False)


@pytest.mark.parametrize("shape", ["chain4", "tree3x2", "mixed"])
def test_subset_draft_proposes_only_subset_tokens_and_stays_lossless(target_model, reference, shape):
    draft_model = build_tiny("llama", vocab_size=96, seed=1, hidden_size=32, num_layers=1)
    vocab_subset.install(draft_model, SUBSET)
    draft = DraftEngine(make_runner(draft_model))
    proposed: list[int] = []
    speculate = draft.speculate

    def recording(items: list[SpecItem]):
        trees = speculate(items)
        proposed.extend(t for tree in trees for t in tree.token_ids)
        return trees

    draft.speculate = recording
    prompts = prompts_for(4, seed=3)
    outs, _ = run_sd(TargetEngine(make_runner(target_model)), draft, prompts, SHAPES[shape])
    for k, prompt in prompts.items():
        assert outs[k] == reference.greedy(prompt, NUM_TOKENS), k
    assert proposed and set(proposed) <= set(SUBSET)
