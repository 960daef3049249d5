"""The public ``tandem.v1.Tandem`` service: requests in, token streams out, over one Scheduler.

    Generate(msg) ─▶ to_request (checks) ─▶ scheduler.submit ─▶ on_submit hooks
                  ◀─ started ◀─ tokens (one chunk per committed step) ◀─ final

Each chunk carries the text its tokens add (incremental decoding), the commit
timestamp of every token, and how many were accepted draft tokens (from the
``StepLedger``). A client that cancels its call, or whose deadline passes,
aborts the request: the loop ends it and releases its KV cache on both
workers at the next step boundary. Errors are exceptions with a ``grpc_code``
(services.scheduler.errors), mapped to statuses by the error interceptor.

Observers attached to the scheduler may define ``on_submit(request)``
(synchronous): it is called right after a request is queued, before the loop
can run a step for it, so a trace span or a Redis record exists before the
request's first event; and ``on_summary(request, summary)``, called with the
final message before it is sent, while the call's server span is still open
(the tracer writes the request's outcome on it).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

import shared.rpc  # noqa: F401 - builds the generated code if needed
from scheduler.engine_loop import RequestStream, Scheduler, TokenEvent
from scheduler.request import Request
from services.scheduler.errors import DuplicateRequestError, UnknownRequestError
from services.scheduler.ledger import StepLedger
from services.scheduler.queue_gate import QueueGate
from services.scheduler.summary import summary_pb
from services.scheduler.text import TextCodec
from services.scheduler.timebase import Timebase
from services.scheduler.translate import Limits, to_request
from shared.rpc.convert import CallTimer, logprobs_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2, tandem_pb2_grpc

log = logging.getLogger(__name__)

InfoSource = Callable[[], Awaitable[common_pb2.ServiceInfo | None]]

RECENT_IDS = 10_000  # finished ids remembered, so Abort can tell "already finished" from "never existed"


class TandemServicer(tandem_pb2_grpc.TandemServicer):
    def __init__(
        self,
        scheduler: Scheduler,
        ledger: StepLedger,
        limits: Limits,
        codec: TextCodec | None = None,
        *,
        version: str = "",
        target_info: InfoSource | None = None,
        draft_info: InfoSource | None = None,
        gate: QueueGate | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.ledger = ledger
        self.limits = limits
        self.codec = codec
        self.version = version
        self.target_info = target_info
        self.draft_info = draft_info
        self.timebase = Timebase(scheduler.clock)
        self.gate = gate or QueueGate(1 << 30)
        self._recent: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ RPCs
    async def Generate(
        self, request: tandem_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[tandem_pb2.GenerateResponse]:
        async for msg in self._generate(request):
            yield msg

    async def GenerateUnary(
        self, request: tandem_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.GenerateResult:
        result = tandem_pb2.GenerateResult()
        async for msg in self._generate(request, final_only=True):  # woken once, at the end
            result.request_id = msg.request_id
            kind = msg.WhichOneof("event")
            if kind == "tokens":
                result.token_ids.extend(msg.tokens.token_ids)
                result.text += msg.tokens.text
                result.token_timestamps_unix_ns.extend(msg.tokens.timestamps_unix_ns)
                result.logprobs.extend(msg.tokens.logprobs)
                result.prompt_logprobs.extend(msg.tokens.prompt_logprobs)
            elif kind == "final":
                result.summary.CopyFrom(msg.final)
        return result

    async def Abort(
        self, request: tandem_pb2.AbortRequest, context: grpc.aio.ServicerContext
    ) -> tandem_pb2.AbortResponse:
        timer = CallTimer()
        if self.scheduler.abort(request.request_id):
            log.info("request %s aborted by the client", request.request_id)
            return tandem_pb2.AbortResponse(aborted=True, timing=timer.timing())
        if request.request_id in self._recent:
            return tandem_pb2.AbortResponse(aborted=False, timing=timer.timing())
        raise UnknownRequestError(f"no request with id {request.request_id!r} is queued, running or recently finished")

    async def Info(self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> tandem_pb2.TandemInfo:
        sched = self.scheduler
        info = tandem_pb2.TandemInfo(
            service_version=self.version,
            queue_policy=sched.queue_policy.name,
            speculation_policy=sched.spec_policy.name,
            num_running=len(sched.running),
            num_waiting=len(sched.waiting),
            chat_template=self.codec is not None and self.codec.has_chat_template,
        )
        for field, source in (("target", self.target_info), ("draft", self.draft_info)):
            if source is None:
                continue
            try:
                reply = await source()
            except Exception as exc:  # noqa: BLE001 - a model service being down is what Info should show
                log.warning("%s Info failed: %s", field, exc)
                continue
            if reply is not None:
                getattr(info, field).CopyFrom(reply)
        return info

    # ------------------------------------------------------------------ one request
    async def _generate(self, msg: tandem_pb2.GenerateRequest,
                        final_only: bool = False) -> AsyncIterator[tandem_pb2.GenerateResponse]:  # fmt: skip
        """The request's messages; ``final_only``: its tokens are read once it ends (a caller that returns the
        whole output), not as each step commits them (RequestStream.final_only)."""
        arrival = self.scheduler.clock.now()
        req = to_request(msg, self.limits, self.codec)
        req.arrival_time = arrival
        stream = self._submit(req)
        if final_only:
            stream.final_only()
        eos_ids = set(self.codec.eos_token_ids if self.codec else ()) - set(msg.stop_token_ids)
        decoder = self.codec.stream() if self.codec else None
        try:
            yield tandem_pb2.GenerateResponse(
                request_id=req.id,
                started=tandem_pb2.GenerateStarted(
                    num_prompt_tokens=len(req.prompt_ids), arrival_unix_ns=self.timebase.unix_ns(arrival)
                ),
            )
            async for event in stream:
                text = decoder.push(event.token_ids) if decoder else ""
                if event.finished and decoder:
                    text += decoder.flush()
                if event.token_ids or text:
                    yield tandem_pb2.GenerateResponse(request_id=req.id, tokens=self._chunk(req, event, text))
            summary = summary_pb(req, self.ledger.forget(req.id), self.timebase, eos_ids)
            self._tell("on_summary", req, summary)
            yield tandem_pb2.GenerateResponse(request_id=req.id, final=summary)
        finally:
            self._close(req)

    def _submit(self, req: Request) -> RequestStream:
        if self.scheduler.get(req.id) is not None:
            raise DuplicateRequestError(f"request id {req.id!r} is already live; pick another or leave it empty")
        self.gate.check(len(self.scheduler.waiting))
        stream = self.scheduler.submit(req)  # ValueError (e.g. over the token budget) -> INVALID_ARGUMENT
        self.ledger.track(req.id)
        self._tell("on_submit", req)
        return stream

    def _tell(self, hook: str, *args: object) -> None:
        """Call ``hook`` on every observer that defines it (synchronously)."""
        for observer in self.scheduler.observers:
            fn = getattr(observer, hook, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - observers never fail a request
                log.exception("observer %r failed in %s", observer, hook)

    def _chunk(self, req: Request, event: TokenEvent, text: str) -> tandem_pb2.TokenChunk:
        span = slice(event.index, event.index + len(event.token_ids))
        chunk = tandem_pb2.TokenChunk(
            token_ids=event.token_ids,
            text=text,
            timestamps_unix_ns=[self.timebase.unix_ns(t) for t in req.token_times[span]],
            num_accepted=self.ledger.take_accepted(req.id, len(event.token_ids)) if event.token_ids else 0,
        )
        if req.sampling.logprobs is not None:
            chunk.logprobs.extend(logprobs_to_pb(lp) for lp in req.output_logprobs[span])
        if event.index == 0 and req.prompt_logprobs:
            chunk.prompt_logprobs.extend(logprobs_to_pb(lp) for lp in req.prompt_logprobs)
        return chunk

    def _close(self, req: Request) -> None:
        """The call ended: normally, or cancelled by the client (then the request is aborted)."""
        if not req.state.done:
            log.info("request %s: call ended before the request did; aborting it", req.id)
            self.scheduler.abort(req.id)
        self.ledger.forget(req.id)
        self.gate.on_finish(self.scheduler.clock.now())
        self._recent[req.id] = None
        while len(self._recent) > RECENT_IDS:
            self._recent.popitem(last=False)
