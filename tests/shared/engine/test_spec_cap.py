"""The target's cap of a relayed shape agrees with the scheduler's SpecShape.capped for every shape kind."""

import pytest

from scheduler.spec_shape import SpecShape
from shared.engine.spec_cap import capped_item, item_depth

SHAPES = [SpecShape.chain(4), SpecShape.chain(6, 0.3), SpecShape.tree(4, 3), SpecShape.expanded((2, 2, 1)),
          SpecShape.expanded((1, 3, 1, 1))]  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("cap", [-1, 0, 1, 2, 3, 4, 10])
def test_capped_item_matches_spec_shape_capped(shape: SpecShape, cap: int) -> None:
    item = shape.spec_item("s", [7, 8])
    capped = capped_item(item, cap)
    expected = shape.capped(max(0, cap))
    if not expected.speculates:
        assert capped is None
    else:
        assert capped == expected.spec_item("s", [7, 8])
        assert item_depth(capped) == expected.max_depth


def test_nothing_to_draft_stays_nothing() -> None:
    assert capped_item(SpecShape.chain(3).spec_item("s", [1]).__class__("s", [1]), 5) is None
