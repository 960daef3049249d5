"""A draft plan's chain items as columns (shared/rpc/chain_packing.py): the items come back as they went, only
chains and appends without features pack, and columns that disagree are a clear error."""

from __future__ import annotations

import random

import pytest

from shared.engine.errors import InvalidRequestError
from shared.engine.features import FeatureBlock
from shared.engine.types import SpecItem
from shared.rpc.chain_packing import pack_chain_items, unpack_chain_items
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.packing import pack_i32


def test_chain_items_come_back_as_they_went():
    rng = random.Random(2)
    for case in range(100):
        items = [SpecItem(f"s{i}", [rng.randrange(1 << 20) for _ in range(rng.randint(0, 6))],
                          chain_len=rng.randint(0, 8), rollback=rng.choice([0, 0, 3]),
                          confidence_threshold=rng.choice([0.0, 0.25]))
                 for i in range(rng.randint(0, 9))]  # fmt: skip
        msg = draft_pb2.PackedChainItems.FromString(pack_chain_items(items).SerializeToString())
        assert unpack_chain_items(msg) == items, case


def test_trees_and_features_do_not_pack():
    chain = SpecItem("a", [1], chain_len=2)
    assert pack_chain_items([chain, SpecItem("b", [1], tree_depth=2, tree_width=2)]) is None
    assert pack_chain_items([chain, SpecItem("c", [1], tree_expansion=(2, 2), tree_depth=2, tree_width=4)]) is None
    assert pack_chain_items([SpecItem("d", [1], chain_len=2, features=FeatureBlock(0, 1, 2, "float16", bytes(4)))]) is None


@pytest.mark.parametrize("bad", [
    dict(seq_ids=["a", "b"], num_new_tokens=pack_i32([1]), new_tokens=pack_i32([5]), chain_lengths=pack_i32([2, 2])),
    dict(seq_ids=["a"], num_new_tokens=pack_i32([2]), new_tokens=pack_i32([5]), chain_lengths=pack_i32([2])),
    dict(seq_ids=["a"], num_new_tokens=pack_i32([-1]), new_tokens=b"", chain_lengths=pack_i32([2])),
    dict(seq_ids=["a"], num_new_tokens=pack_i32([1]), new_tokens=pack_i32([5]), chain_lengths=pack_i32([-3])),
    dict(seq_ids=["a"], num_new_tokens=pack_i32([1]), new_tokens=b"\x01\x02\x03", chain_lengths=pack_i32([2])),
])  # fmt: skip
def test_columns_that_disagree_are_invalid(bad):
    with pytest.raises(InvalidRequestError):
        unpack_chain_items(draft_pb2.PackedChainItems(**bad))


def test_items_of_one_fixed_expansion_pack_as_columns_too():
    from shared.engine.types import SpecItem
    from shared.rpc.chain_packing import pack_chain_items, unpack_chain_items

    tree = dict(tree_depth=2, tree_width=4, tree_expansion=(2, 2))
    items = [SpecItem("a", [5, 6], **tree), SpecItem("b", [7], rollback=1, **tree), SpecItem("c", [8])]
    msg = pack_chain_items(items)
    assert list(msg.tree_expansion) == [2, 2]
    assert unpack_chain_items(msg) == items
    assert pack_chain_items([SpecItem("a", [], **tree), SpecItem("b", [], chain_len=2)]) is None  # mixed shapes
    assert pack_chain_items([SpecItem("a", [], tree_depth=2, tree_width=2)]) is None  # a beam
    assert pack_chain_items([SpecItem("a", [], **tree), SpecItem("b", [], tree_depth=1, tree_width=3,
                                                                  tree_expansion=(3,))]) is None  # two expansions
