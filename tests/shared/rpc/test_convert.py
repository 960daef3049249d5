"""Protobuf <-> engine dataclasses round-trip."""

from __future__ import annotations

import pytest
import torch

from shared.engine.errors import InvalidRequestError
from shared.engine.types import (
    AcceptResult,
    ForwardCost,
    PrefillItem,
    SamplingParams,
    SparseDist,
    SpecItem,
    TokenTree,
    VerifyItem,
)
from shared.rpc import convert
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2


def _wire(msg):
    """Serialize and parse, as the network would."""
    return type(msg).FromString(msg.SerializeToString())


def test_sampling_round_trip_and_defaults() -> None:
    for params in [SamplingParams(), SamplingParams(0.7, 0.9, seed=42), SamplingParams(1.0, 1.0, seed=0)]:
        assert convert.sampling_from_pb(_wire(convert.sampling_to_pb(params))) == params
    assert convert.sampling_from_pb(common_pb2.SamplingParams()) == SamplingParams()  # unset: greedy, top_p 1


def test_tree_round_trip() -> None:
    tree = TokenTree(
        token_ids=[5, 6, 7],
        parent_ids=[-1, -1, 0],
        draft_probs=[0.5, 0.25, 0.75],
        child_dists={0: SparseDist(torch.tensor([5, 6, 9]), torch.tensor([0.5, 0.25, 0.25]))},
    )
    back = convert.tree_from_pb(_wire(convert.tree_to_pb(tree)))
    assert (back.token_ids, back.parent_ids, back.draft_probs) == (tree.token_ids, tree.parent_ids, tree.draft_probs)
    assert list(back.child_dists) == [0]
    assert back.child_dists[0].token_ids.tolist() == [5, 6, 9] and back.child_dists[0].token_ids.dtype == torch.int64
    assert torch.allclose(back.child_dists[0].probs, tree.child_dists[0].probs)
    empty = convert.tree_from_pb(_wire(convert.tree_to_pb(TokenTree())))
    assert len(empty) == 0 and empty.child_dists == {}


def test_a_relayed_tree_keeps_the_wire_lists_and_goes_on_unchanged() -> None:
    """The scheduler's path (draft -> scheduler -> target): no tensors on the way, the same message out."""
    tree = TokenTree(
        token_ids=[5, 6, 7],
        parent_ids=[-1, -1, 0],
        draft_probs=[0.5, 0.25, 0.75],
        child_dists={0: SparseDist(torch.tensor([5, 6, 9]), torch.tensor([0.5, 0.25, 0.25])),
                     1: SparseDist(torch.tensor([7]), torch.tensor([1.0]))},
    )
    sent = _wire(convert.tree_to_pb(tree))
    relayed = convert.tree_from_pb(sent, relay=True)
    assert all(isinstance(d.token_ids, list) and isinstance(d.probs, list) for d in relayed.child_dists.values())
    assert _wire(convert.tree_to_pb(relayed)) == sent
    at_target = convert.tree_from_pb(_wire(convert.tree_to_pb(relayed)))
    assert at_target.child_dists[1].token_ids.tolist() == [7] and at_target.child_dists[0].probs.dtype == torch.float32
    with pytest.raises(InvalidRequestError, match="row 5"):  # validated on the relay too
        convert.tree_from_pb(common_pb2.TokenTree(token_ids=[1], parent_ids=[-1],
                                                  child_dists=[common_pb2.ChildDist(row=5)]), relay=True)


@pytest.mark.parametrize(
    "msg, match",
    [
        (common_pb2.TokenTree(token_ids=[1, 2], parent_ids=[-1]), "parent_ids"),
        (common_pb2.TokenTree(token_ids=[1], parent_ids=[-1], draft_probs=[0.1, 0.2]), "draft_probs"),
        (common_pb2.TokenTree(token_ids=[1], parent_ids=[-1], child_dists=[common_pb2.ChildDist(row=5)]), "row 5"),
        (
            common_pb2.TokenTree(
                token_ids=[1], parent_ids=[-1], child_dists=[common_pb2.ChildDist(row=0, token_ids=[1], probs=[])]
            ),
            "probs",
        ),
    ],
)
def test_malformed_tree_is_invalid_request(msg: common_pb2.TokenTree, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        convert.tree_from_pb(msg)


def test_items_round_trip() -> None:
    prefill = PrefillItem("r1", [1, 2, 3], SamplingParams(0.5, 0.8, seed=7))
    assert convert.prefill_item_from_pb(_wire(convert.prefill_item_to_pb(prefill))) == prefill
    verify = VerifyItem("r1", TokenTree.chain([4, 5]))
    back = convert.verify_item_from_pb(_wire(convert.verify_item_to_pb(verify)))
    assert back.tree.parent_ids == [-1, 0] and back.tree.token_ids == [4, 5]
    for item in [
        SpecItem("r1", [3, 4], chain_len=4, confidence_threshold=0.25),
        SpecItem("r2", [9], tree_depth=3, tree_width=2),
        SpecItem("r5", [9], tree_depth=4, tree_width=3, tree_expansion=(1, 1, 3, 1)),  # SpecInfer's expansion
        SpecItem("r3", [1]),
    ]:
        assert convert.spec_item_from_pb(_wire(convert.spec_item_to_pb(item))) == item
    with pytest.raises(InvalidRequestError):
        convert.spec_item_to_pb(SpecItem("r4", chain_len=2, tree_depth=2, tree_width=2))


def test_accept_result_and_costs() -> None:
    result = AcceptResult(accepted_nodes=[0, 2], tokens=[5, 7, 11], node_status=[1, 0, 1, -1])
    msg = _wire(convert.accept_to_pb("r1", result))
    assert list(msg.node_status) == [
        target_pb2.NODE_STATUS_ACCEPTED,
        target_pb2.NODE_STATUS_REJECTED,
        target_pb2.NODE_STATUS_ACCEPTED,
        target_pb2.NODE_STATUS_UNREACHED,
    ]
    assert convert.accept_from_pb(msg) == ("r1", result)
    cost = ForwardCost(duration_s=0.0125, num_seqs=3, num_batched_tokens=17, num_context_tokens=900)
    assert convert.cost_from_pb(_wire(convert.cost_to_pb(cost))) == cost
    timing = convert.CallTimer().timing(forward_ns=5)
    assert timing.forward_ns == 5 and timing.total_ns > 0 and timing.start_unix_ns > 1_600_000_000 * 10**9
