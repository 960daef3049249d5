"""TargetService over a TargetEngine: protobuf in, one engine step, protobuf out.

Prefill, Verify and Step are the same engine call (``TargetEngine.step``, one
forward pass for the whole batch) with different halves filled in. Handlers
hold no try/except: malformed messages raise InvalidRequestError in
shared.rpc.convert, bad requests raise typed EngineErrors in the engine
(which validates everything before it mutates anything), and the error
interceptor turns both into status codes.

ResizeKV (Nightjar §5.1, elastic memory) grows the KV pool into the space
of an offloaded co-located draft and shrinks it back before the draft
reloads; the scheduler calls it around the draft's Offload and Reload.
"""

from __future__ import annotations

import time

import grpc.aio

from services.engine_host import EngineHost
from services.spans import annotate, event, grammar_cost
from services.target.draft_relay import DraftRelay
from services.target.outcome_hold import HOLD_S, OutcomeHold
from services.target.feature_push import FeaturePusher
from services.stream_writer import StreamWriter
from services.target.repeat_plan import LastStep
from services.target.step_stream import run_plan
from shared.engine.target_engine import TargetEngine, TargetStepOutput
from shared.engine.types import PrefillItem, VerifyItem
from shared.engine.features import FeatureSpec
from shared.rpc.convert import (
    CallTimer,
    accept_to_pb,
    cost_to_pb,
    feature_block_to_pb,
    feature_spec_from_pb,
    prefill_item_from_pb,
    prefill_result_to_pb,
    verify_item_from_pb,
)
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2, target_pb2_grpc


class TargetServiceServicer(target_pb2_grpc.TargetServiceServicer):
    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.engine: TargetEngine = host.engine
        self.pusher = FeaturePusher(getattr(host, "settings", None))  # rows straight to a feature draft
        host.closers = [*getattr(host, "closers", ()), self.pusher.close]  # its shared-memory ring, at shutdown
        host.feature_pusher = self.pusher
        self.relay = DraftRelay(getattr(host, "settings", None))  # tokens straight to the draft, trees straight back
        host.closers, host.draft_relay = [*host.closers, self.relay.close], self.relay
        hold_ms = getattr(getattr(host, "settings", None), "outcome_hold_ms", None)
        self.outcome_hold_s = HOLD_S if hold_ms is None else hold_ms / 1e3  # 0: every outcome alone

    async def Prefill(
        self, request: target_pb2.TargetPrefillRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.TargetPrefillResponse:
        timer = CallTimer()
        prefills = [prefill_item_from_pb(m) for m in request.items]
        out, costs, timing = await self._step(prefills, [], timer, _spec(request))
        return target_pb2.TargetPrefillResponse(
            outputs=[prefill_result_to_pb(r) for r in out.prefills], costs=costs, timing=timing
        )

    async def Verify(
        self, request: target_pb2.VerifyRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.VerifyResponse:
        timer = CallTimer()
        verifies = [verify_item_from_pb(m) for m in request.items]
        out, costs, timing = await self._step([], verifies, timer, _spec(request))
        return target_pb2.VerifyResponse(
            outputs=[accept_to_pb(v.seq_id, r) for v, r in zip(verifies, out.verifies)], costs=costs, timing=timing
        )

    async def Step(self, request: target_pb2.StepRequest, context: grpc.aio.ServicerContext) -> target_pb2.StepResponse:
        timer = CallTimer()
        prefills = [prefill_item_from_pb(m) for m in request.prefills]
        verifies = [verify_item_from_pb(m) for m in request.verifies]
        out, costs, timing = await self._step(prefills, verifies, timer, _spec(request))
        return target_pb2.StepResponse(
            prefills=[prefill_result_to_pb(r) for r in out.prefills],
            verifies=[accept_to_pb(v.seq_id, r) for v, r in zip(verifies, out.verifies)],
            costs=costs,
            timing=timing,
        )

    async def StepStream(self, request_iterator, context: grpc.aio.ServicerContext):
        last = LastStep()  # what a plan that goes on continues (repeat_plan.py)
        outcomes = StreamWriter(context, "step-outcomes")  # the next step runs while one leaves
        hold = OutcomeHold(self.outcome_hold_s)  # short steps: two outcomes per message (outcome_hold.py)
        try:
            async for plan in request_iterator:  # one plan, one engine step, one outcome (step_stream.py)
                began = time.perf_counter()
                async for outcome, steps_after in run_plan(self, plan, last):  # and its continuations (repeat_plan.py)
                    now = time.perf_counter()
                    if (msg := hold.offer(outcome, steps_after, now - began)) is not None:
                        outcomes.put(msg)
                    began = now
                    # the step's handoff to the draft left before its outcome was packed (step_stream.py): the next
                    # tree is drafted while the outcome is built and travels; anything still unsent leaves now
                    await self.relay.flush()
        finally:
            await outcomes.close()

    async def Release(
        self, request: common_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ReleaseResponse:
        return await self.host.release(request)

    async def Info(self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> common_pb2.ServiceInfo:
        return self.host.info()

    async def ResizeKV(
        self, request: target_pb2.ResizeKVRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.ResizeKVResponse:
        timer = CallTimer()
        cache = self.host.kv_cache
        before = cache.num_blocks
        ran = await self.host.run(self.engine.resize_kv, request.num_blocks)
        attrs = dict(kv_blocks_before=before, kv_blocks_total=cache.num_blocks, kv_blocks_free=cache.num_free_blocks)
        annotate(kv_bytes=ran.result, **attrs)
        event("kv.resize", **attrs)
        return target_pb2.ResizeKVResponse(
            kv_blocks_total=cache.num_blocks,
            kv_blocks_free=cache.num_free_blocks,
            kv_bytes=ran.result,
            timing=ran.timing(timer),
        )

    async def Features(
        self, request: target_pb2.FeaturesRequest, context: grpc.aio.ServicerContext
    ) -> target_pb2.FeaturesResponse:
        timer = CallTimer()
        spec = feature_spec_from_pb(request.spec)
        seq_ids = list(request.seq_ids)
        annotate(batch_size=len(seq_ids), seq_ids=seq_ids, feature_layers=list(spec.layer_ids))
        ran = await self.host.run(self.engine.features, seq_ids, spec)
        blocks = ran.result
        annotate(feature_bytes=sum(len(b.data) for b in blocks), feature_rows=sum(b.num_rows for b in blocks))
        return target_pb2.FeaturesResponse(
            outputs=[target_pb2.FeatureOutput(seq_id=s, features=feature_block_to_pb(b)) for s, b in zip(seq_ids, blocks)],
            timing=ran.timing(timer),
        )

    async def _step(
        self,
        prefills: list[PrefillItem],
        verifies: list[VerifyItem],
        timer: CallTimer,
        features: FeatureSpec | None = None,
        releases: list[str] | None = None,
        stream: bool = False,
    ) -> tuple[TargetStepOutput, list[common_pb2.ForwardCost], common_pb2.Timing]:
        annotate(
            batch_size=len(prefills) + len(verifies),
            num_prefills=len(prefills),
            prefill_tokens=sum(len(p.prompt_ids) for p in prefills),
            tree_nodes=[len(v.tree) for v in verifies],
            seq_ids=[p.seq_id for p in prefills] + [v.seq_id for v in verifies],
        )
        run = self.host.run_step if stream else self.host.run  # a step stream's plan may run inline
        ran = await run(self._engine_step, prefills, verifies, features, releases)
        out = ran.result
        if features is not None:  # what travels to the draft, per step (only committed tokens' rows)
            blocks = [r.features for r in [*out.prefills, *out.verifies] if r.features is not None]
            annotate(feature_bytes=sum(len(b.data) for b in blocks), feature_rows=sum(b.num_rows for b in blocks))
        costs = [cost_to_pb(out.cost)] if out.cost is not None else []
        if verifies:
            annotate(accepted_lens=[r.num_accepted for r in out.verifies])
        if out.cost is not None:
            annotate(batched_tokens=out.cost.num_batched_tokens, context_tokens=out.cost.num_context_tokens)
        timing = ran.timing(timer, forward_ns=sum(c.duration_ns for c in costs))
        annotate(**grammar_cost(self.engine, timing))
        return out, costs, timing

    def _engine_step(self, prefills, verifies, features, releases) -> TargetStepOutput:
        """On the engine thread: a step stream's releases first, then the step (none: nothing to run)."""
        if releases:
            self.host._release_live(releases)
        if prefills or verifies or releases is None:  # a unary call with nothing in it: the engine says "empty batch"
            return self.engine.step(prefills, verifies, features)
        return TargetStepOutput()  # a step stream's release-only plan


def _spec(request) -> FeatureSpec | None:
    """The request's FeatureSpec, when the scheduler asked for features (a feature-level draft is in use)."""
    return feature_spec_from_pb(request.features) if request.HasField("features") else None
