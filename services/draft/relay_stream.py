"""Draft relay, the draft's side (services/target/draft_relay.py): the target's handoffs in, trees out.

    RelayHandoff(per sequence: committed tokens to append, next shape) ─▶ ONE batched speculate ─▶ RelayTrees

With relay lookahead (relay_lookahead.py) an answer also carries, per sequence, the tree after the next one,
drafted on its optimistic prefix; a handoff whose target took it is again one engine call. Each handoff is
one engine call (two where some sequence needs a fresh tree and a lookahead), behind whatever the scheduler's own stream asked first (the host's
lock). A sequence the draft does not hold (released or never prefilled here, e.g. after a restart) is
answered ``missing`` and the others run; a call that fails answers them all missing: their state here is
unknown, and the scheduler resynchronises them as after a failed speculate.
"""

from __future__ import annotations

import logging

from services.draft.relay_lookahead import _LookaheadFailed
from services.draft.spec_stream import stream_spec_item_from_pb
from services.plan_spans import plan_span
from services.spans import annotate, recording
from shared.engine.errors import InvalidRequestError
from shared.engine.types import TokenTree
from shared.rpc.chain_packing import unpack_chain_items
from shared.rpc.convert import CallTimer
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.packing import pack_trees

log = logging.getLogger(__name__)
SERVICE = "tandem.v1.DraftService"
_NONE = TokenTree()  # where an item has no tree (packed, never changed)


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
    flags = handoff.lookahead_flags
    ready = [(k, i) for k, i in enumerate(items) if i.seq_id in held and i.features is None]
    fresh, looks, bad, taken = {}, {}, set(), set()
    ran = None
    if ready:
        with plan_span(getattr(servicer.host, "tracer_provider", None), SERVICE, "Speculate", handoff.trace_context):
            if recording():
                annotate(batch_size=len(ready), seq_ids=[i.seq_id for _, i in ready], relayed=True,
                         new_tokens=sum(len(i.new_tokens) for _, i in ready))  # fmt: skip
            ready_flags = bytes(flags[k] if k < len(flags) else 0 for k, _ in ready) if flags else b""
            try:
                ran = await servicer.host.run_step(servicer._relay, [i for _, i in ready], ready_flags)
            except Exception as exc:  # noqa: BLE001 - the engine validates before it mutates, but say unknown
                log.info("relay handoff %d failed: %s", handoff.step, exc)
            else:
                got_fresh, got_looks, got_bad, got_taken = ran.result[0]
                fresh = {k: t for (k, _), t in zip(ready, got_fresh)}
                looks = {k: t for (k, _), t in zip(ready, got_looks) if len(t)}
                bad = {ready[j][0] for j in got_bad}
                taken = {ready[j][0] for j in got_taken}
                if recording():
                    annotate(drafted_tokens=[len(t) for t in got_fresh], lookahead_tokens=[len(t) for t in got_looks])
    missing = [i.seq_id for k, i in enumerate(items) if k not in fresh or k in bad]
    timing = ran.timing(timer, forward_ns=round(sum(c.duration_s for c in ran.result[1]) * 1e9)) if ran else timer.timing()
    answer = draft_pb2.RelayTrees(step=handoff.step, missing=missing, timing=timing,
                                  trees=pack_trees([fresh.get(k, _NONE) for k in range(len(items))]))  # fmt: skip
    if looks:
        answer.lookaheads.CopyFrom(pack_trees([looks.get(k, _NONE) for k in range(len(items))]))
    if taken - bad:
        answer.taken = bytes(1 if k in taken and k not in bad else 0 for k in range(len(items)))
    return answer


def relay_on_engine(servicer, items, flags: bytes):
    """On the engine thread: ((fresh trees, lookaheads, indices not applied), forward costs)."""
    costs = []

    def speculate(batch):
        trees = servicer.engine.speculate(batch)
        costs.extend(servicer.engine.costs)
        return trees

    try:
        answer = servicer.lookahead.run(speculate, items, flags)
    except _LookaheadFailed as exc:
        log.info("relay lookahead failed; the fresh trees go without it")
        answer = exc.answer
    return answer, costs
