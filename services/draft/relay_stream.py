"""Draft relay, the draft's side (services/target/draft_relay.py): the target's handoffs in, trees out.

    RelayHandoff(per sequence: committed tokens to append, next shape) ─▶ ONE batched speculate ─▶ RelayTrees

Each handoff is one engine call, behind whatever the scheduler's own stream asked first (the host's
lock). A sequence the draft does not hold (released or never prefilled here, e.g. after a restart) is
answered ``missing`` and the others run; a call that fails answers them all missing: their state here is
unknown, and the scheduler resynchronises them as after a failed speculate.
"""

from __future__ import annotations

import logging

from services.draft.spec_stream import stream_spec_item_from_pb
from services.plan_spans import plan_span
from services.spans import annotate
from shared.engine.errors import InvalidRequestError
from shared.engine.types import TokenTree
from shared.rpc.chain_packing import unpack_chain_items
from shared.rpc.convert import CallTimer
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.packing import pack_trees

log = logging.getLogger(__name__)
SERVICE = "tandem.v1.DraftService"


async def run_relay_handoff(servicer, handoff: draft_pb2.RelayHandoff) -> draft_pb2.RelayTrees:
    timer = CallTimer()
    try:
        if handoff.HasField("chains") and handoff.items:
            raise InvalidRequestError("a relay handoff has both packed chain items and items")
        items = unpack_chain_items(handoff.chains) if handoff.HasField("chains") else [
            stream_spec_item_from_pb(m) for m in handoff.items]  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - a malformed handoff: nothing applied, all missing
        log.info("relay handoff %d refused: %s", handoff.step, exc)
        ids = list(handoff.chains.seq_ids) or [m.seq_id for m in handoff.items]
        return draft_pb2.RelayTrees(step=handoff.step, trees=pack_trees([TokenTree()] * len(ids)), missing=ids)
    held = servicer.engine.runner.seqs
    ready = [i for i in items if i.seq_id in held and i.features is None]
    drafted: dict[str, TokenTree] = {}
    ran = None
    if ready:
        with plan_span(getattr(servicer.host, "tracer_provider", None), SERVICE, "Speculate", handoff.trace_context):
            annotate(batch_size=len(ready), seq_ids=[i.seq_id for i in ready], relayed=True,
                     new_tokens=sum(len(i.new_tokens) for i in ready))  # fmt: skip
            try:
                ran = await servicer.host.run_step(servicer._plan, [], [], ready)
            except Exception as exc:  # noqa: BLE001 - the engine validates before it mutates, but say unknown
                log.info("relay handoff %d failed: %s", handoff.step, exc)
            else:
                trees = ran.result[0]
                drafted = {i.seq_id: t for i, t in zip(ready, trees)}
                annotate(drafted_tokens=[len(t) for t in trees])
    missing = [i.seq_id for i in items if i.seq_id not in drafted]
    timing = ran.timing(timer, forward_ns=round(sum(c.duration_s for c in ran.result[1]) * 1e9)) if ran else timer.timing()
    return draft_pb2.RelayTrees(step=handoff.step, trees=pack_trees([drafted.get(i.seq_id, TokenTree()) for i in items]),
                                missing=missing, timing=timing)  # fmt: skip
