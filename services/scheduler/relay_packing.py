"""The draft relay's fields of a TargetPlan and its outcome (services/target/draft_relay.py), scheduler side."""

from __future__ import annotations

from services.scheduler.grpc_workers import WorkerProtocolError
from shared.engine.types import RELAY_TAKE, AcceptResult, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import target_pb2
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.packing import pack_i32, unpack_trees


def pack_relay(plan: target_pb2.TargetPlan, verifies: list[VerifyItem], draft: str) -> None:
    """Each verify's relay flag, and the handoffs the step is to make to the draft at ``draft`` (columns when
    all are chains, as most steps: shared/rpc/chain_packing.py)."""
    if any(i.relay for i in verifies):
        plan.relay_flags = bytes(i.relay for i in verifies)
        if any(i.relay_cut for i in verifies):
            plan.relay_max_nodes = pack_i32([i.relay_cut for i in verifies])
    handoffs = [i for i in verifies if i.handoff is not None]
    if not handoffs:
        return
    plan.relay.draft = draft
    chains = pack_chain_items([i.handoff for i in handoffs])
    if chains is not None:
        plan.relay.chains.CopyFrom(chains)
        plan.relay.remaining = pack_i32([i.remaining for i in handoffs])
        return
    for item in handoffs:
        spec = item.handoff
        msg = plan.relay.items.add(seq_id=item.seq_id, pending_tokens=pack_i32(spec.new_tokens), remaining=item.remaining)
        if spec.chain_len:
            msg.chain.length, msg.chain.confidence_threshold = spec.chain_len, spec.confidence_threshold
        else:
            msg.tree.depth, msg.tree.width = spec.tree_depth, spec.tree_width
            msg.tree.expansion.extend(spec.tree_expansion)


def relayed_trees(reply: target_pb2.TargetOutcome, verifies: list[VerifyItem]) -> dict[int, TokenTree]:
    """The relayed trees the target verified, by verify index (flag 1, not missed)."""
    missed = set(reply.relay_missed)
    taken = [k for k, i in enumerate(verifies) if i.relay == RELAY_TAKE and i.seq_id not in missed]
    return dict(zip(taken, unpack_trees(reply.relayed_trees, len(taken), relay=True)))


def relay_outcome(reply: target_pb2.TargetOutcome, verifies: list[VerifyItem], accepts: list[AcceptResult],
                  trees: dict[int, TokenTree]) -> None:  # fmt: skip
    """Tell each result its relayed tree, whether it was missed, and whether the step handed it off."""
    missed, relayed = set(reply.relay_missed), set(reply.relayed)
    flagged = {i.seq_id for i in verifies if i.relay}
    if not missed <= flagged or not relayed <= {i.seq_id for i in verifies if i.handoff is not None}:
        raise WorkerProtocolError("target StepStream: relay outcome names sequences the plan did not relay")
    for k, (item, res) in enumerate(zip(verifies, accepts)):
        res.relay_tree = trees.get(k)
        res.relay_missed = item.seq_id in missed
        res.relayed = item.seq_id in relayed
