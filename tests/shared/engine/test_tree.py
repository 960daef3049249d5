"""Token-tree helpers: validation, depths, children per row, the ancestor mask."""

import pytest
import torch

from shared.engine.errors import InvalidRequestError, InvalidTreeError
from shared.engine.tree import ancestors, children_of, depths, validate_tree

# The tree from types.py:   root ── 0 ── 2
#                               └── 1 ── 3 ── 4
PARENTS = [-1, -1, 0, 1, 3]
TOKENS = [5, 6, 7, 8, 9]


def test_valid_tree_passes():
    validate_tree(TOKENS, PARENTS, vocab_size=10)
    validate_tree([], [], vocab_size=10)  # an empty tree is fine: plain decoding


@pytest.mark.parametrize(
    "parents, bad_node",
    [
        ([-1, 1], 1),  # self-loop
        ([-1, 2, 0], 1),  # forward reference (would allow cycles)
        ([0], 0),  # the first node can only hang off the root
        ([-1, -2], 1),  # below -1
        ([-1, 0, 7], 2),  # out of range
    ],
)
def test_bad_parent_raises_naming_the_node(parents, bad_node):
    with pytest.raises(InvalidTreeError, match=f"node {bad_node} has parent"):
        validate_tree([0] * len(parents), parents, vocab_size=10)


def test_length_mismatch_raises():
    with pytest.raises(InvalidTreeError):
        validate_tree([1, 2], [-1], vocab_size=10)


@pytest.mark.parametrize("bad_token", [-1, 10, 1000])
def test_token_outside_vocab_raises_invalid_request(bad_token):
    with pytest.raises(InvalidRequestError, match="node 1 has token id") as info:
        validate_tree([3, bad_token], [-1, 0], vocab_size=10)
    assert not isinstance(info.value, InvalidTreeError)


def test_depths():
    assert depths(PARENTS) == [0, 0, 1, 1, 2]
    assert depths([-1, 0, 1, 2]) == [0, 1, 2, 3]  # a chain
    assert depths([]) == []


def test_children_of_rows():
    # row 0 = root, row i + 1 = node i; every row present, leaves with []
    assert children_of(PARENTS) == {0: [0, 1], 1: [2], 2: [3], 3: [], 4: [4], 5: []}
    assert children_of([]) == {0: []}


def test_ancestors_mask():
    anc = ancestors(PARENTS)
    assert anc.dtype == torch.bool and anc.shape == (5, 5)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],  # 0: itself
            [0, 1, 0, 0, 0],  # 1: itself
            [1, 0, 1, 0, 0],  # 2: 0, itself
            [0, 1, 0, 1, 0],  # 3: 1, itself
            [0, 1, 0, 1, 1],  # 4: 1, 3, itself
        ],
        dtype=torch.bool,
    )
    assert torch.equal(anc, expected)


def test_ancestors_of_chain_is_lower_triangular():
    assert torch.equal(ancestors([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())
    assert ancestors([]).shape == (0, 0)
