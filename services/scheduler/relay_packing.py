"""The draft relay's fields of a TargetPlan and its outcome (services/target/draft_relay.py), scheduler side."""

from __future__ import annotations

from services.scheduler.grpc_workers import WorkerProtocolError
from shared.engine.types import RELAY_TAKE, AcceptResult, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import target_pb2
from shared.rpc.packing import unpack_trees


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
