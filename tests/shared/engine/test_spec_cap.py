"""The target's cap of a relayed shape agrees with the scheduler's SpecShape.capped for every shape kind."""

import pytest

from scheduler.spec_shape import SpecShape
from shared.engine.spec_cap import capped_item, cut_chain, item_depth
from shared.engine.types import SparseDist, TokenTree

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


def test_a_chain_is_cut_to_its_first_nodes_and_a_tree_is_not():
    chain = TokenTree([5, 6, 7], [-1, 0, 1], [0.9, 0.8, 0.7], {0: SparseDist([5], [1.0]), 2: SparseDist([7], [1.0])})
    cut = cut_chain(chain, 2)
    assert (cut.token_ids, cut.parent_ids, cut.draft_probs, sorted(cut.child_dists)) == ([5, 6], [-1, 0], [0.9, 0.8], [0])
    assert cut_chain(chain, 0) is chain and cut_chain(chain, 3) is chain
    tree = TokenTree([5, 6, 7], [-1, -1, 0], [0.5, 0.4, 0.3])
    assert cut_chain(tree, 1) is tree
