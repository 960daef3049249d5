"""Structured output under speculation: the grammar masks the draft's proposals and every verified row.

Tiny random llamas over the demo tokenizer's 49,152-token vocabulary (SmolLM2's, for llguidance), a
JSON schema, a regex and a choice: greedy speculative output (chains, beam trees, SpecInfer trees,
garbage trees a model-free draft could send) equals constrained decoding without speculation token
for token, on the static and the eager verify path, and every token is one the grammar allows.
"""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import InvalidRequestError
from shared.engine.grammar import GrammarBook
from shared.engine.target_engine import TargetEngine
from shared.engine.types import GrammarSpec, PrefillItem, SamplingParams, SpecItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny

from conftest import make_runner

VOCAB = 49152
NUM_TOKENS = 16
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                   "role": {"enum": ["admin", "user"]}},  # fmt: skip
    "required": ["name", "age", "role"],
}
GRAMMARS = {
    "schema": GrammarSpec("json_schema", json.dumps(SCHEMA)),
    "object": GrammarSpec("json_object"),
    "regex": GrammarSpec("regex", r"([0-9]{3})-([0-9]{4}) [a-z]+"),
    "choice": GrammarSpec("choice", json.dumps(["positive", "negative", "neutral"])),
}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from shared.engine.tokenizer_dir import load_tokenizer

    pytest.importorskip("llguidance")
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def book(tokenizer) -> GrammarBook:
    return GrammarBook(tokenizer, VOCAB)


@pytest.fixture(scope="module")
def models():
    return build_tiny("llama", vocab_size=VOCAB, seed=0), build_tiny("llama", vocab_size=VOCAB, seed=1, num_layers=1)


def engines(models, book, static: bool = True):
    target = TargetEngine(make_runner(models[0], static_step=static, cpu_prepack=False))
    draft = DraftEngine(make_runner(models[1], cpu_prepack=False))
    target.grammars = draft.grammars = book
    return target, draft


def prompts_for(batch: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"r{i}": [rng.randrange(100, 20000) for _ in range(rng.randint(3, 12))] for i in range(batch)}


def decode(target, draft, prompts, grammars, shape_of=None, sampling=SamplingParams()):
    """prefill -> (speculate -> verify)* until NUM_TOKENS each; no draft / shape: plain constrained decoding."""
    items = [PrefillItem(k, p, sampling, grammar=at(grammars.get(k), len(p))) for k, p in prompts.items()]
    outs, new = {}, {}
    for r in target.prefill(items):
        outs[r.seq_id] = [r.first_token]
        new[r.seq_id] = [r.first_token]
    if shape_of is not None and draft is not None:
        draft.prefill(items)
    trees_seen = []
    while live := [k for k in prompts if len(outs[k]) < NUM_TOKENS]:
        if shape_of is None:
            trees = [TokenTree() for _ in live]
        elif draft is None:
            trees = [shape_of(k) for k in live]  # a model-free draft's trees, grammar unseen
        else:
            trees = draft.speculate([shape_of(k, new[k]) for k in live])
        trees_seen += list(zip(live, trees, [list(outs[k]) for k in live]))
        for k, tree, accepted in zip(live, trees, target.verify([VerifyItem(k, t) for k, t in zip(live, trees)])):
            assert len(accepted.node_status) == len(tree)
            assert all(tree.token_ids[j] == t for j, t in zip(accepted.accepted_nodes, accepted.tokens))
            outs[k] += accepted.tokens
            new[k] = accepted.tokens
    target.release(list(prompts))
    if shape_of is not None and draft is not None:
        draft.release(list(prompts))
    target.runner.check_accounting()
    return {k: v[:NUM_TOKENS] for k, v in outs.items()}, trees_seen


def at(spec: GrammarSpec | None, start: int) -> GrammarSpec | None:
    """The spec with the grammar starting after the prompt (as the scheduler sends it)."""
    return None if spec is None else dataclasses.replace(spec, start=start)


def allowed_by(book: GrammarBook, spec: GrammarSpec, tokens: list[int]) -> bool:
    """Every token is one the grammar allows (up to its end, then only EOS)."""
    state = book.state(spec)
    return all(state.valid_nodes([], tokens, list(range(-1, len(tokens) - 1))))


SHAPES = {
    "chain4": lambda k, new: SpecItem(k, new, chain_len=4),
    "tree3x2": lambda k, new: SpecItem(k, new, tree_depth=3, tree_width=2),
    "expansion": lambda k, new: SpecItem(k, new, tree_depth=3, tree_width=4, tree_expansion=(2, 2, 1)),
}


PROMPTS = prompts_for(5, seed=3)
MIXED = {k: spec for k, spec in zip(PROMPTS, GRAMMARS.values())}  # one prompt per grammar, the last one free


@pytest.fixture(scope="module")
def reference(models, book) -> dict[str, list[int]]:
    """Constrained decoding without speculation (eager path), and the free prompt decoded alone."""
    outs, _ = decode(*engines(models, book, static=False), PROMPTS, MIXED)
    free = [k for k in PROMPTS if k not in MIXED][0]
    alone, _ = decode(*engines(models, book, static=False), {free: PROMPTS[free]}, {})
    assert alone[free] == outs[free]  # a grammar in the batch changes nothing for the others
    for k, spec in MIXED.items():
        assert allowed_by(book, spec, outs[k]), k
    return outs


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("static", [True, False])
def test_greedy_speculation_equals_constrained_decoding(models, book, reference, shape, static):
    outs, trees = decode(*engines(models, book, static), PROMPTS, MIXED, SHAPES[shape])
    assert outs == reference
    for k, tree, before in trees:  # the draft proposes only what the grammar allows, along every path
        if k in MIXED:
            state = book.state(MIXED[k])
            assert all(state.valid_nodes(before, tree.token_ids, tree.parent_ids)), (k, tree.token_ids)


def test_model_free_garbage_trees_are_pruned_and_output_unchanged(models, book, reference):
    rng = random.Random(0)

    def garbage(k):
        n = rng.randint(1, 6)
        return TokenTree([rng.choice([90, 28, 1, 2, 7] + [rng.randrange(VOCAB)]) for _ in range(n)],
                         [rng.randrange(-1, i) for i in range(n)])  # fmt: skip

    target, _ = engines(models, book)
    outs, _ = decode(target, None, PROMPTS, MIXED, garbage)
    assert outs == reference


def test_self_draft_is_fully_accepted_under_a_grammar(models, book):
    """The target as its own draft: with the same masks on both sides every drafted token is accepted."""
    target = TargetEngine(make_runner(models[0], cpu_prepack=False))
    draft = DraftEngine(make_runner(models[0], cpu_prepack=False))
    target.grammars = draft.grammars = book
    prompts = prompts_for(2, seed=7)
    grammars = {k: GRAMMARS["schema"] for k in prompts}
    items = [PrefillItem(k, p, grammar=at(grammars[k], len(p))) for k, p in prompts.items()]
    new = {r.seq_id: [r.first_token] for r in target.prefill(items)}
    draft.prefill(items)
    for _ in range(3):
        trees = draft.speculate([SpecItem(k, new[k], chain_len=4) for k in prompts])
        for k, tree, accepted in zip(prompts, trees, target.verify([VerifyItem(k, t) for k, t in zip(prompts, trees)])):
            assert accepted.num_accepted == len(tree) == 4
            new[k] = accepted.tokens


@pytest.mark.parametrize("spec, message", [
    (GrammarSpec("json_schema", "{not json"), "json_schema"),
    (GrammarSpec("json_schema", json.dumps({"type": "nonsense"})), "nonsense"),
    (GrammarSpec("regex", "a(b"), "unclosed group"),
    (GrammarSpec("choice", "[]"), "non-empty"),
    (GrammarSpec("lark", "start: x"), "kind"),
    (GrammarSpec("regex", "abc", start=1), "not allowed by the grammar"),  # the prompt's tail is not "abc"
])  # fmt: skip
def test_bad_grammars_raise_before_anything_is_added(models, book, spec, message):
    target, draft = engines(models, book)
    good = PrefillItem("ok", [5, 6, 7])
    for engine in (target, draft):
        with pytest.raises(InvalidRequestError, match=message):
            engine.prefill([good, PrefillItem("bad", [1, 2, 3], grammar=spec if spec.start else at(spec, 3))])
        assert not engine.runner.seqs
        engine.runner.check_accounting()


def test_no_tokenizer_no_grammar(models):
    target = TargetEngine(make_runner(models[0], cpu_prepack=False))
    with pytest.raises(InvalidRequestError, match="tokenizer"):
        target.prefill([PrefillItem("a", [1, 2], grammar=GRAMMARS["object"])])
    assert not target.runner.seqs
