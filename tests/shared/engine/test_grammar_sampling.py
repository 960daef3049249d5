"""Sampled structured output under speculation follows the constrained target distribution.

p'(x) = p(x) 1[grammar allows x] / sum of allowed p: the draft samples from its own masked
distribution, the target verifies against its masked rows, and the first token of every step is
distributed as p' (chi-square, rejected at p < 1e-3, fixed seeds). Each trial drafts from the same
committed prefix and rolls the target back, so COPIES trials share each batched forward; each copy
is its own sequence with its own grammar state.
"""

from __future__ import annotations

import json

import pytest
import torch

from shared.engine.draft_engine import DraftEngine
from shared.engine.grammar import GrammarBook
from shared.engine.grammar_mask import disallowed
from shared.engine.runner import Work
from shared.engine.sampling import probs_from_logits
from shared.engine.target_engine import TargetEngine
from shared.engine.types import GrammarSpec, PrefillItem, SamplingParams, SpecItem, VerifyItem
from shared.models.tiny import build_tiny

from conftest import make_runner
from test_engine_sampling import ALPHA, chi_square

VOCAB = 49152
TRIALS = 1200
COPIES = 60
PROMPT = [400, 401, 402, 403]
# single-token-ish words: the first position allows a handful of prefixes of them (y, ye, yes, n, no, ...)
CHOICE = GrammarSpec("choice", json.dumps(["yes", "no", "maybe", "never", "always"]), start=len(PROMPT))


@pytest.fixture(scope="module")
def book(smollm2_dir) -> GrammarBook:
    from shared.engine.tokenizer_dir import load_tokenizer

    pytest.importorskip("llguidance")
    return GrammarBook(load_tokenizer(smollm2_dir), VOCAB)


def constrained_root(model, book: GrammarBook, params: SamplingParams) -> torch.Tensor:
    """p' at the first generated position: [vocab]."""
    runner = make_runner(model, cpu_prepack=False)
    seq = runner.add("ref", PROMPT, params)
    logits = runner.forward([Work(seq, want_root=True)]).root(0)[None]  # [1, vocab]
    bitmask, _ = book.state(CHOICE).masks(PROMPT, [], [])
    logits = logits.masked_fill(torch.as_tensor(disallowed(bitmask, VOCAB, logits.device)), float("-inf"))
    return probs_from_logits(logits, params)[0]


SHAPES = {
    "chain": lambda k: SpecItem(k, [], chain_len=3),
    "beam_tree": lambda k: SpecItem(k, [], tree_depth=2, tree_width=3),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_first_token_follows_the_constrained_target_distribution(book, shape):
    params = SamplingParams(temperature=1.0, seed=5)
    target_model = build_tiny("llama", vocab_size=VOCAB, seed=21, initializer_range=0.3)
    draft_model = build_tiny("llama", vocab_size=VOCAB, seed=22, initializer_range=0.3, num_layers=1)
    p = constrained_root(target_model, book, params)  # [vocab]
    allowed = (p > 0).nonzero().flatten()
    assert 3 <= len(allowed) <= 40 and float(p[allowed].max()) < 0.9  # a spread, non-trivial p'

    target = TargetEngine(make_runner(target_model, cpu_prepack=False, num_blocks=2048))
    draft = DraftEngine(make_runner(draft_model, cpu_prepack=False, num_blocks=2048))
    target.grammars = draft.grammars = book
    ids = [f"s{i}" for i in range(COPIES)]
    items = [PrefillItem(k, PROMPT, SamplingParams(1.0, seed=100 + i), grammar=CHOICE) for i, k in enumerate(ids)]
    target.prefill(items)
    draft.prefill(items)
    for k in ids:  # the prefill's token is dropped: every trial starts from PROMPT
        target.runner.truncate(target.runner.get(k), 1)
    counts = torch.zeros(VOCAB)
    accepted_any = 0
    for _ in range(TRIALS // COPIES):
        trees = draft.speculate([SHAPES[shape](k) for k in ids])
        for k, tree, result in zip(ids, trees, target.verify([VerifyItem(k, t) for k, t in zip(ids, trees)])):
            counts[result.tokens[0]] += 1
            accepted_any += result.num_accepted > 0
            target.runner.truncate(target.runner.get(k), len(result.tokens))
    assert counts[(p == 0)].sum() == 0  # nothing the grammar forbids, ever
    assert accepted_any > 0  # drafts were accepted, so both paths of the rule were exercised
    assert chi_square(counts, p) > ALPHA
    target.runner.check_accounting()
