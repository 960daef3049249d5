"""Bad input raises a typed error, changes nothing, and leaves both engines usable.

Each case is applied to engines that already hold a live request mid-generation;
afterwards the KV accounting still balances and that request continues exactly
as on engines that never saw the bad input.
"""

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import (
    ContextLengthError,
    DuplicateSequenceError,
    EngineError,
    InvalidRequestError,
    InvalidTreeError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, TokenTree, VerifyItem

from conftest import make_runner

VOCAB = 96
MAX_CONTEXT = 64
NUM_BLOCKS = 24  # block_size 4: 96 slots in all
PROMPT = [5, 9, 2, 7]


def engines(target_model, draft_model):
    target = TargetEngine(make_runner(target_model, num_blocks=NUM_BLOCKS, max_context=MAX_CONTEXT))
    draft = DraftEngine(make_runner(draft_model, num_blocks=NUM_BLOCKS, max_context=MAX_CONTEXT))
    return target, draft


def live_request(target, draft) -> int:
    """Put request "live" two steps into speculative generation; returns its last token."""
    first = target.prefill([PrefillItem("live", PROMPT)])[0].first_token
    draft.prefill([PrefillItem("live", PROMPT)])
    tree = draft.speculate([SpecItem("live", [first], chain_len=3)])[0]
    return target.verify([VerifyItem("live", tree)])[0].tokens[-1]


def continue_live(target, draft, last: int) -> list[int]:
    tree = draft.speculate([SpecItem("live", [last], chain_len=3)])[0]
    return target.verify([VerifyItem("live", tree)])[0].tokens


def chain(tokens: list[int]) -> TokenTree:
    return TokenTree(token_ids=tokens, parent_ids=list(range(-1, len(tokens) - 1)))


TARGET_CASES = {
    "empty prompt": (lambda t: t.prefill([PrefillItem("x", [])]), InvalidRequestError, "empty prompt"),
    "token out of vocab": (lambda t: t.prefill([PrefillItem("x", [1, VOCAB])]), InvalidRequestError, "token id"),
    "negative token": (lambda t: t.prefill([PrefillItem("x", [1, -1])]), InvalidRequestError, "token id"),
    "prompt over context": (
        lambda t: t.prefill([PrefillItem("x", [1] * (MAX_CONTEXT + 1))]),
        ContextLengthError,
        "context",
    ),
    "out of KV blocks": (
        lambda t: t.prefill([PrefillItem(f"x{i}", [1] * 40) for i in range(3)]),
        OutOfBlocksError,
        "block",
    ),
    "bad sampling": (
        lambda t: t.prefill([PrefillItem("x", [1], SamplingParams(temperature=-1))]),
        InvalidRequestError,
        "temperature",
    ),
    "duplicate id": (lambda t: t.prefill([PrefillItem("live", [1])]), DuplicateSequenceError, "live"),
    "unknown id": (lambda t: t.verify([VerifyItem("ghost", chain([1]))]), UnknownSequenceError, "ghost"),
    "tree cycle": (
        lambda t: t.verify([VerifyItem("live", TokenTree(token_ids=[1, 2], parent_ids=[1, 0]))]),
        InvalidTreeError,
        "parent",
    ),
    "parent out of range": (
        lambda t: t.verify([VerifyItem("live", TokenTree(token_ids=[1, 2], parent_ids=[-1, 5]))]),
        InvalidTreeError,
        "parent",
    ),
    "parents length": (
        lambda t: t.verify([VerifyItem("live", TokenTree(token_ids=[1, 2], parent_ids=[-1]))]),
        InvalidRequestError,
        "parent",
    ),
    "tree token out of vocab": (
        lambda t: t.verify([VerifyItem("live", chain([1, VOCAB + 3]))]),
        InvalidRequestError,
        "token id",
    ),
    "tree over context": (
        lambda t: t.verify([VerifyItem("live", chain([1] * MAX_CONTEXT))]),
        ContextLengthError,
        "context",
    ),
    "valid prefill batched with a bad verify": (
        lambda t: t.step([PrefillItem("ok", [1, 2])], [VerifyItem("ghost", chain([1]))]),
        UnknownSequenceError,
        "ghost",
    ),
}

DRAFT_CASES = {
    "empty prompt": (lambda d: d.prefill([PrefillItem("x", [])]), InvalidRequestError, "empty prompt"),
    "token out of vocab": (lambda d: d.prefill([PrefillItem("x", [VOCAB])]), InvalidRequestError, "token id"),
    "duplicate id": (lambda d: d.prefill([PrefillItem("live", [1])]), DuplicateSequenceError, "live"),
    "unknown id": (lambda d: d.speculate([SpecItem("ghost", [1], chain_len=2)]), UnknownSequenceError, "ghost"),
    "chain and tree": (
        lambda d: d.speculate([SpecItem("live", [1], chain_len=2, tree_depth=2, tree_width=2)]),
        InvalidRequestError,
        "not both",
    ),
    "chain too long": (lambda d: d.speculate([SpecItem("live", [1], chain_len=10_000)]), InvalidRequestError, "chain"),
    "new token out of vocab": (
        lambda d: d.speculate([SpecItem("live", [VOCAB], chain_len=2)]),
        InvalidRequestError,
        "token id",
    ),
    "prompt over context": (
        lambda d: d.prefill([PrefillItem("x", [1] * (MAX_CONTEXT + 1))]),
        ContextLengthError,
        "context",
    ),
    "out of KV blocks": (
        lambda d: d.prefill([PrefillItem(f"x{i}", [1] * 40) for i in range(3)]),
        OutOfBlocksError,
        "block",
    ),
}


@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_rejects_bad_input_and_stays_usable(case, target_model, draft_model):
    call, error, message = TARGET_CASES[case]
    target, draft = engines(target_model, draft_model)
    last = live_request(target, draft)
    free_before = target.runner.cache.num_free_blocks
    with pytest.raises(error, match=message) as info:
        call(target)
    assert isinstance(info.value, EngineError) and info.value.grpc_code != "INTERNAL"
    assert target.runner.cache.num_free_blocks == free_before
    assert set(target.runner.seqs) == {"live"}
    target.runner.check_accounting()

    clean_target, clean_draft = engines(target_model, draft_model)
    clean_last = live_request(clean_target, clean_draft)
    assert last == clean_last
    assert continue_live(target, draft, last) == continue_live(clean_target, clean_draft, clean_last)


@pytest.mark.parametrize("case", list(DRAFT_CASES))
def test_draft_rejects_bad_input_and_stays_usable(case, target_model, draft_model):
    call, error, message = DRAFT_CASES[case]
    target, draft = engines(target_model, draft_model)
    last = live_request(target, draft)
    free_before = draft.runner.cache.num_free_blocks
    with pytest.raises(error, match=message):
        call(draft)
    assert draft.runner.cache.num_free_blocks == free_before
    assert set(draft.runner.seqs) == {"live"}
    draft.runner.check_accounting()

    clean_target, clean_draft = engines(target_model, draft_model)
    clean_last = live_request(clean_target, clean_draft)
    assert continue_live(target, draft, last) == continue_live(clean_target, clean_draft, clean_last)
