"""The target's side of the step stream (docs/services.md, "Step streams"): one TargetPlan, one engine step.

    TargetPlan ─▶ releases, then prefills + verifies in ONE forward (TargetEngine.step) ─▶ TargetOutcome

A plan that fails (a malformed message, an unknown sequence, a full KV pool) answers a ``StepError``
with the status its unary call would have had, and the stream goes on: the engine validates before it
mutates, so nothing of that step was committed. Features, when the plan asks for them, come back in
the outcome, one block per prefill then per verify (empty where a sequence has none).
"""

from __future__ import annotations

import logging

import grpc

from services.plan_spans import plan_span
from shared.engine.features import FeatureBlock
from shared.engine.types import VerifyItem
from shared.rpc.convert import CallTimer, feature_block_to_pb, feature_spec_from_pb, logprobs_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2
from shared.rpc.interceptors import status_for_exception
from services.target.relay_plan import hand_off, relay_items, take_relayed
from services.target.repeat_plan import MAX_REPEAT, LastStep, StepItems, check_goes_on, check_repeat, continuation, refused
from shared.engine.errors import InvalidRequestError
from shared.rpc.packing import pack_accepts, pack_i32, pack_trees, stream_prefill_from_pb, unpack_trees

log = logging.getLogger(__name__)
SERVICE = "tandem.v1.TargetService"
_EMPTY_BLOCK = common_pb2.FeatureBlock()
_INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def plan_name(num_prefills: int, num_verifies: int) -> str:
    """The unary method a plan stands for, for its span: Prefill, Verify, Step (both) or Release (neither)."""
    if num_prefills and num_verifies:
        return "Step"
    return "Prefill" if num_prefills else "Verify" if num_verifies else "Release"


async def run_plan(servicer, plan: target_pb2.TargetPlan, last: LastStep | None = None):
    """A plan's outcome, then its continuation steps' (TargetPlan.repeat, repeat_plan.py), one by one, each with the
    number of this plan's steps still to run after it; ``last`` keeps the stream's last step, which a plan that goes
    on (TargetPlan.goes_on) continues."""
    last = last if last is not None else LastStep()
    first, end = plan.step, plan.step + 1 + min(plan.repeat, MAX_REPEAT)
    if plan.goes_on:
        if problem := check_goes_on(plan, last) or check_repeat(plan):
            last.plan, last.error = None, common_pb2.StepError(code=_INVALID, message=problem)
    else:
        results, items = [], StepItems()
        reply = await run_target_plan(servicer, plan, results, items)
        last.ran(plan, reply, results, items)
        yield reply, end - first - 1
        first += 1
    for step in range(first, end):
        if last.error is not None:  # nothing committed: its continuations answer the same
            yield refused(step, last.error), end - step - 1
            continue
        (nxt, items), results = continuation(last), []
        nxt.step = step
        reply = await run_target_plan(servicer, nxt, results, items)
        last.ran(nxt, reply, results, items)
        yield reply, end - step - 1


async def run_target_plan(servicer, plan: target_pb2.TargetPlan, results: list | None = None,
                          items: StepItems | None = None) -> target_pb2.TargetOutcome:  # fmt: skip
    """One step; ``results`` gets its verifies' AcceptResults. ``items``: the step's verifies and handoffs when
    already known (a continuation's), else they are read from the plan into it."""
    timer = CallTimer()
    name = plan_name(len(plan.prefills), len(plan.verify_ids))
    with plan_span(getattr(servicer.host, "tracer_provider", None), SERVICE, name, plan.trace_context):
        try:
            if problem := check_repeat(plan):
                raise InvalidRequestError(problem)
            prefills = [stream_prefill_from_pb(m) for m in plan.prefills]
            if items is not None and items.verifies is not None:
                verifies, handoffs = items.verifies, items.handoffs
            else:
                trees = unpack_trees(plan.trees, len(plan.verify_ids))
                verifies = [VerifyItem(seq_id, tree) for seq_id, tree in zip(plan.verify_ids, trees)]
                handoffs = relay_items(plan.relay) if plan.HasField("relay") else None  # checked before anything runs
                if items is not None:
                    items.verifies, items.handoffs = verifies, handoffs
            spec = feature_spec_from_pb(plan.features) if plan.HasField("features") else None
            taken = await take_relayed(servicer.relay, plan, verifies)
            out, costs, timing = await servicer._step(prefills, verifies, timer, spec, releases=list(plan.releases),
                                                     stream=True)
        except Exception as exc:  # noqa: BLE001 - the step's status, in band: the stream stays up
            code, details = status_for_exception(exc)
            (log.error if code.name == "INTERNAL" else log.info)("step %d -> %s: %s", plan.step, code.name, details)
            return target_pb2.TargetOutcome(step=plan.step, error=common_pb2.StepError(code=code.value[0],
                                                                                       message=details))  # fmt: skip
    reply = target_pb2.TargetOutcome(step=plan.step, costs=costs, timing=timing)
    if results is not None:
        results.extend(out.verifies)
    if handoffs:  # written before the outcome is packed: the draft drafts while the rest is built and sent
        reply.relayed.extend(hand_off(servicer.relay, plan, handoffs, out.verifies, taken.bases))
        await servicer.relay.flush()
    if plan.relay_flags:
        reply.relay_missed.extend(taken.missed)
        reply.relayed_trees.CopyFrom(pack_trees(taken.trees))
        reply.relay_lookaheads = taken.lookaheads
    if prefills:
        reply.first_tokens = pack_i32([r.first_token for r in out.prefills])
        if any(r.pending or r.num_prefilled or r.num_cached for r in out.prefills):  # chunked prefill, prefix cache
            reply.prefill_pending = pack_i32([int(r.pending) for r in out.prefills])
            reply.prefill_num_prefilled = pack_i32([r.num_prefilled for r in out.prefills])
            reply.prefill_num_cached = pack_i32([r.num_cached for r in out.prefills])
    if verifies:
        reply.accepts.CopyFrom(pack_accepts(out.verifies))
    if any(r.logprobs is not None or r.prompt_logprobs for r in out.prefills):
        reply.prefill_logprobs.extend(_prefill_logprobs_pb(r) for r in out.prefills)
    if any(r.logprobs for r in out.verifies):
        reply.verify_logprobs.extend(target_pb2.VerifyOutput(logprobs=[logprobs_to_pb(lp) for lp in r.logprobs or ()])
                                     for r in out.verifies)  # fmt: skip
    if spec is not None:
        blocks = [r.features for r in [*out.prefills, *out.verifies]]
        if plan.push_features_to:  # straight to the draft; the outcome says which rows went (feature_push.py)
            ids = [p.seq_id for p in prefills] + list(plan.verify_ids)
            sent = [(i, b) for i, b in zip(ids, blocks) if b is not None and b.num_rows]
            if await servicer.pusher.push(plan.push_features_to, [i for i, _ in sent], [b for _, b in sent]):
                reply.features_pushed = True
                reply.pushed_feature_bytes = sum(len(b.data) for _, b in sent)
                blocks = [FeatureBlock(b.start, b.num_rows, b.width, b.dtype, b"", pushed=True) if b is not None
                          else None for b in blocks]  # fmt: skip
        reply.features.extend(feature_block_to_pb(b) if b is not None else _EMPTY_BLOCK for b in blocks)
    return reply


def _prefill_logprobs_pb(result) -> target_pb2.PrefillOutput:
    msg = target_pb2.PrefillOutput(prompt_logprobs=[logprobs_to_pb(lp) for lp in result.prompt_logprobs or ()])
    if result.logprobs is not None:
        msg.logprobs.CopyFrom(logprobs_to_pb(result.logprobs))
    return msg
