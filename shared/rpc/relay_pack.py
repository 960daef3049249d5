"""A step plan's relay part (TargetPlan.relay, relay_flags, relay_max_nodes) packed from verify items: the
scheduler's stream worker packs its plans with it, and the target its continuation steps
(services/target/repeat_plan.py)."""

from __future__ import annotations

from shared.engine.types import VerifyItem
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.gen.tandem.v1 import target_pb2
from shared.rpc.packing import pack_i32


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
