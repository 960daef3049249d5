"""Chunked prefill: a prompt run in chunks (alone, or beside other sequences' verifies) is a one-piece prefill."""

import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import InvalidRequestError, UnknownSequenceError
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem

from conftest import make_runner
from test_prefix_cache import NUM_TOKENS, decode, engines


@pytest.mark.parametrize("chunk", [1, 3, 4, 7, 64])
@pytest.mark.parametrize("cache", [False, True])
def test_chunked_prefill_is_greedy_exact(target_model, draft_model, reference, chunk, cache):
    prompt = [random.Random(chunk).randrange(96) for _ in range(23)]
    target, draft = engines(target_model, draft_model, prefix_caching=cache)
    for turn in range(2):  # the second turn starts warm when the cache is on
        assert decode(target, draft, f"r{turn}", prompt, chunk=chunk) == reference.greedy(prompt, NUM_TOKENS)
        target.runner.check_accounting()


def test_chunks_join_verifies_in_one_forward(target_model, draft_model, reference):
    target = TargetEngine(make_runner(target_model))
    draft = DraftEngine(make_runner(draft_model))
    first = target.prefill([PrefillItem("old", [4, 5, 6, 7])])[0].first_token
    draft.prefill([PrefillItem("old", [4, 5, 6, 7])])
    out_old, new = [first], [first]
    long = list(range(10, 40))
    step = target.step([PrefillItem("long", long, max_tokens=8)], [])
    assert step.prefills[0].pending and step.prefills[0].num_prefilled == 8 and step.prefills[0].first_token == -1
    while True:
        tree = draft.speculate([SpecItem("old", new, chain_len=2)])[0]
        step = target.step([PrefillItem("long", [], max_tokens=8, resume=True)], [VerifyItem("old", tree)])
        new = step.verifies[0].tokens
        out_old += new
        assert step.cost.num_batched_tokens <= 8 + 1 + len(tree)
        if not step.prefills[0].pending:
            break
    assert step.prefills[0].num_prefilled == len(long)
    assert step.prefills[0].first_token == reference.greedy(long, 1)[0]
    assert out_old == reference.greedy([4, 5, 6, 7], len(out_old))


def test_sampled_chunked_prefill_draws_the_same_first_token(target_model):
    sampling = SamplingParams(temperature=1.0, seed=11)
    prompt = list(range(5, 30))
    firsts = []
    for chunk in (0, 5):
        target = TargetEngine(make_runner(target_model, prefix_caching=False))
        res = target.prefill([PrefillItem("s", prompt, sampling, max_tokens=chunk)])[0]
        while res.pending:
            res = target.prefill([PrefillItem("s", [], sampling, max_tokens=chunk, resume=True)])[0]
        firsts.append(res.first_token)
    assert firsts[0] == firsts[1]


def test_bad_chunk_requests_are_refused(target_model):
    target = TargetEngine(make_runner(target_model))
    with pytest.raises(UnknownSequenceError):
        target.prefill([PrefillItem("nope", [], max_tokens=4, resume=True)])
    target.prefill([PrefillItem("a", list(range(1, 20)), max_tokens=4)])
    with pytest.raises(InvalidRequestError):
        target.verify([VerifyItem("a")])  # its prefill has not finished
    with pytest.raises(InvalidRequestError):
        target.prefill([PrefillItem("a", [3], max_tokens=4, resume=True)])
    with pytest.raises(InvalidRequestError):
        target.prefill([PrefillItem("b", [1, 2], max_tokens=-1)])
    target.release(["a"])
    assert not target.pending
    target.runner.check_accounting()
