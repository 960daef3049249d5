"""Prefill batches: atomic when an item is bad; the draft reports the forward it ran."""

from __future__ import annotations

import pytest

from shared.engine.errors import ContextLengthError
from shared.engine.types import ForwardCost, PrefillItem


@pytest.mark.parametrize("role", ["target", "draft"])
def test_over_context_item_strands_nothing(role, request):
    engine = request.getfixturevalue(role)
    too_long = [7] * (engine.runner.max_context + 1)
    with pytest.raises(ContextLengthError, match="'b'.*context window"):
        engine.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", too_long)])
    assert engine.runner.seqs == {}
    engine.runner.check_accounting()
    engine.prefill([PrefillItem("a", [1, 2, 3])])  # the id is free again
    assert list(engine.runner.seqs) == ["a"]


def test_draft_prefill_reports_its_forward_cost(draft):
    draft.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5])])
    (cost,) = draft.costs
    assert isinstance(cost, ForwardCost) and (cost.num_seqs, cost.num_batched_tokens) == (2, 5)
