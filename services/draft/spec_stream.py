"""The draft's side of the step stream (docs/services.md, "Step streams"): one DraftPlan, one engine call.

    DraftPlan ─▶ releases, prefills, then ONE batched speculate (appends + drafting) ─▶ DraftOutcome

A plan that fails answers a ``StepError`` with the status its unary call would have had; the stream
goes on, and the scheduler treats the draft's state for the plan's sequences as unknown (a resync),
exactly as after a failed unary Speculate.
"""

from __future__ import annotations

import logging

from services.plan_spans import plan_span
from services.spans import annotate
from shared.engine.errors import InvalidRequestError
from shared.engine.types import SpecItem
from shared.rpc.convert import CallTimer, cost_to_pb, feature_block_from_pb
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2
from shared.rpc.interceptors import status_for_exception
from shared.rpc.packing import pack_trees, stream_prefill_from_pb, unpack_i32

log = logging.getLogger(__name__)
SERVICE = "tandem.v1.DraftService"


def stream_spec_item_from_pb(msg: draft_pb2.StreamSpecItem) -> SpecItem:
    where = f"sequence {msg.seq_id!r}"
    item = SpecItem(seq_id=msg.seq_id, new_tokens=unpack_i32(msg.new_tokens, f"{where} new_tokens"),
                    rollback=msg.rollback)  # fmt: skip
    if msg.HasField("features"):
        item.features = feature_block_from_pb(msg.features, where)
    shape = msg.WhichOneof("shape")
    if shape == "chain":
        item.chain_len, item.confidence_threshold = msg.chain.length, msg.chain.confidence_threshold
    elif shape == "tree":
        item.tree_depth, item.tree_width, item.tree_expansion = msg.tree.depth, msg.tree.width, tuple(msg.tree.expansion)
    return item


async def run_draft_plan(servicer, plan: draft_pb2.DraftPlan) -> draft_pb2.DraftOutcome:
    """Releases and prefills, then the speculation: one engine call each, each in a span named as its unary
    method (Prefill, Speculate), so a trace shows them as the unary protocol did."""
    timer = CallTimer()
    provider = getattr(servicer.host, "tracer_provider", None)
    trees, costs, queue_ns, work_ns = [], [], 0, 0
    try:
        prefills = [stream_prefill_from_pb(m) for m in plan.prefills]
        items = [stream_spec_item_from_pb(m) for m in plan.items]
        if len({i.seq_id for i in items}) != len(items):
            raise InvalidRequestError("a draft plan names a sequence twice")
        parts = []  # (span name, releases, prefills, items): one engine call each
        if prefills or plan.releases:
            parts.append(("Prefill" if prefills else "Release", list(plan.releases), prefills, []))
        if items:
            parts.append(("Speculate", [], [], items))
        for name, releases, part_prefills, part_items in parts:
            with plan_span(provider, SERVICE, name, plan.trace_context):
                annotate(batch_size=len(part_items) or len(part_prefills), seq_ids=[i.seq_id for i in part_items]
                         or [p.seq_id for p in part_prefills], new_tokens=sum(len(i.new_tokens) for i in part_items),
                         feature_bytes=sum(len(x.features.data) for x in [*part_prefills, *part_items]
                                           if x.features is not None))  # fmt: skip
                ran = await servicer.host.run(servicer._plan, releases, part_prefills, part_items)
                part_trees, part_costs = ran.result
                annotate(drafted_tokens=[len(t) for t in part_trees], draft_forwards=len(part_costs))
            trees, costs = trees + part_trees, costs + [cost_to_pb(c) for c in part_costs]
            queue_ns, work_ns = queue_ns + ran.queue_ns, work_ns + ran.work_ns
    except Exception as exc:  # noqa: BLE001 - the plan's status, in band: the stream stays up
        code, details = status_for_exception(exc)
        (log.error if code.name == "INTERNAL" else log.info)("draft step %d -> %s: %s", plan.step, code.name, details)
        return draft_pb2.DraftOutcome(step=plan.step, error=common_pb2.StepError(code=code.value[0], message=details))
    forward_ns = sum(c.duration_ns for c in costs)
    timing = timer.timing(queue_ns=queue_ns, forward_ns=forward_ns, sample_ns=max(0, work_ns - forward_ns))
    return draft_pb2.DraftOutcome(step=plan.step, trees=pack_trees(trees), costs=costs, timing=timing)
