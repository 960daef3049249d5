"""SpecItem.rollback: the draft drops optimistically committed tokens and drafts as if they were never there."""

from shared.engine.types import PrefillItem, SpecItem

import pytest

from shared.engine.errors import InvalidRequestError


def test_rollback_then_draft_equals_never_committed(draft):
    draft.prefill([PrefillItem("a", [1, 2, 3, 4]), PrefillItem("b", [1, 2, 3, 4])])
    # "a" commits a wrong optimistic prefix, then rolls it back and appends the truth; "b" only appends the truth
    draft.speculate([SpecItem("a", [9, 9, 9], chain_len=2), SpecItem("b", [], chain_len=0)])
    (ta, tb) = draft.speculate([SpecItem("a", [5], chain_len=4, rollback=3), SpecItem("b", [5], chain_len=4)])
    assert ta.token_ids == tb.token_ids
    assert draft.runner.get("a").token_ids == draft.runner.get("b").token_ids
    with pytest.raises(InvalidRequestError):
        draft.speculate([SpecItem("a", [], chain_len=1, rollback=99)])
    draft.release(["a", "b"])
    draft.runner.check_accounting()
    assert draft.runner.cache.num_free_blocks == draft.runner.cache.num_blocks
