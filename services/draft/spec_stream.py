"""The draft's side of the step stream (docs/services.md, "Step streams"): one DraftPlan, one engine call.

    DraftPlan ─▶ releases, prefills, then ONE batched speculate (appends + drafting) ─▶ DraftOutcome

A plan that fails answers a ``StepError`` with the status its unary call would have had; the stream
goes on, and the scheduler treats the draft's state for the plan's sequences as unknown (a resync),
exactly as after a failed unary Speculate.
"""

from __future__ import annotations

import logging

from services.plan_spans import plan_span
from services.spans import annotate, grammar_cost
from shared.engine.errors import InvalidRequestError
from shared.engine.features import FeatureBlock
from shared.engine.types import SpecItem, TokenTree
from shared.rpc.chain_packing import unpack_chain_items
from shared.rpc.convert import CallTimer, cost_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2
from shared.rpc.interceptors import status_for_exception
from shared.rpc.packing import pack_trees, stream_features_from_pb, stream_prefill_from_pb, unpack_i32

log = logging.getLogger(__name__)
SERVICE = "tandem.v1.DraftService"


async def fill_pushed(inbox, items) -> set[str]:
    """Replace pushed blocks by the rows the target sent (feature_inbox.py); the ids whose rows never came."""
    missing = set()
    deadline = inbox.deadline() if items else None  # the whole plan waits at most wait_s, not each item
    for item in items:
        block = item.features
        if block is None or not block.pushed:
            continue
        k = block.inline_rows
        rest = await inbox.take(item.seq_id, block.start + k, block.end, deadline) if k < block.num_rows else None
        if k < block.num_rows and rest is None:
            missing.add(item.seq_id)
            continue
        item.features = FeatureBlock.join([b for b in (block.rows(block.start, block.start + k), rest) if b is not None])
        if item.features is not None and item.features.pushed:  # a wholly inline prefix: plain rows
            item.features = FeatureBlock(item.features.start, item.features.num_rows, item.features.width,
                                         item.features.dtype, item.features.data)  # fmt: skip
    return missing


def stream_spec_item_from_pb(msg: draft_pb2.StreamSpecItem) -> SpecItem:
    where = f"sequence {msg.seq_id!r}"
    item = SpecItem(seq_id=msg.seq_id, new_tokens=unpack_i32(msg.new_tokens, f"{where} new_tokens"),
                    rollback=msg.rollback)  # fmt: skip
    item.features = stream_features_from_pb(msg, where)
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
    trees, costs, queue_ns, work_ns, grammar_ns = [], [], 0, 0, 0
    try:
        prefills = [stream_prefill_from_pb(m) for m in plan.prefills]
        if plan.HasField("chains") and plan.items:
            raise InvalidRequestError("a draft plan has both packed chain items and items")
        items = unpack_chain_items(plan.chains) if plan.HasField("chains") else [
            stream_spec_item_from_pb(m) for m in plan.items]  # fmt: skip
        if len({i.seq_id for i in items}) != len(items):
            raise InvalidRequestError("a draft plan names a sequence twice")
        servicer.inbox.forget(list(plan.releases))
        missing = await fill_pushed(servicer.inbox, [*prefills, *items])
        if missing:  # dropped here: the scheduler rebuilds them (recomputed features), as after a restart
            log.info("draft step %d: pushed features of %d sequence(s) never came", plan.step, len(missing))
            prefills = [p for p in prefills if p.seq_id not in missing]
            kept = [i for i in items if i.seq_id not in missing]
            releases = [*plan.releases, *missing]
        else:
            kept, releases = items, list(plan.releases)
        parts = []  # (span name, releases, prefills, items): one engine call each
        if prefills or releases:
            parts.append(("Prefill" if prefills else "Release", releases, prefills, []))
        if kept:
            parts.append(("Speculate", [], [], kept))
        for name, releases, part_prefills, part_items in parts:
            with plan_span(provider, SERVICE, name, plan.trace_context):
                annotate(batch_size=len(part_items) or len(part_prefills), seq_ids=[i.seq_id for i in part_items]
                         or [p.seq_id for p in part_prefills], new_tokens=sum(len(i.new_tokens) for i in part_items),
                         feature_bytes=sum(len(x.features.data) for x in [*part_prefills, *part_items]
                                           if x.features is not None))  # fmt: skip
                if part_prefills:  # what the unary Prefill's span says
                    annotate(prefill_tokens=sum(len(p.prompt_ids) for p in part_prefills))
                ran = await servicer.host.run_step(servicer._plan, releases, part_prefills, part_items)
                part_trees, part_costs = ran.result
                grammar = grammar_cost(servicer.engine)
                annotate(drafted_tokens=[len(t) for t in part_trees], draft_forwards=len(part_costs), **grammar)
                grammar_ns += round(grammar.get("grammar_ms", 0.0) * 1e6)
            trees, costs = trees + part_trees, costs + [cost_to_pb(c) for c in part_costs]
            queue_ns, work_ns = queue_ns + ran.queue_ns, work_ns + ran.work_ns
    except Exception as exc:  # noqa: BLE001 - the plan's status, in band: the stream stays up
        code, details = status_for_exception(exc)
        (log.error if code.name == "INTERNAL" else log.info)("draft step %d -> %s: %s", plan.step, code.name, details)
        return draft_pb2.DraftOutcome(step=plan.step, error=common_pb2.StepError(code=code.value[0], message=details))
    forward_ns = sum(c.duration_ns for c in costs)
    timing = timer.timing(queue_ns=queue_ns, forward_ns=forward_ns, sample_ns=max(0, work_ns - forward_ns))
    timing.grammar_ns = grammar_ns
    if missing:  # an empty tree where an item was dropped
        drafted = iter(trees)
        trees = [TokenTree() if i.seq_id in missing else next(drafted) for i in items]
    return draft_pb2.DraftOutcome(step=plan.step, trees=pack_trees(trees), costs=costs, timing=timing,
                                  missing_features=sorted(missing))  # fmt: skip
