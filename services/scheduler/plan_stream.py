"""One long-lived bidirectional call to a model service: write a plan, read its outcome, in order.

    stream = PlanStream("target", "StepStream", lambda: stub.StepStream(), timeout_s=60)
    outcome = await stream.exchange(plan)      # plan.step is set here; outcome.step must echo it

The call is opened at the first exchange (and again after a break) outside any trace, so the
tracing interceptor opens no stream-long span; each plan carries the current trace context itself
(``trace_context``, services/plan_spans.py). Failures read as the unary calls' did
(grpc_workers.py), so the loop's recovery is unchanged:

    the call breaks (peer gone, reset)   -> WorkerRpcError with the call's status (UNAVAILABLE, ...; grpc's
                                            "Internal error from Core" of a torn-down connection: UNAVAILABLE)
    no outcome within timeout_s          -> WorkerRpcError DEADLINE_EXCEEDED; the call is cancelled
    the stream ends (EOF)                -> WorkerRpcError UNAVAILABLE
    the outcome carries a StepError      -> WorkerRpcError with that status; the stream stays open
    the outcome is for another step      -> WorkerProtocolError; the call is dropped
    the call is cancelled under a wait   -> WorkerRpcError UNAVAILABLE (``drop`` or ``close`` from another task)

Any break drops the call; the next exchange opens a new one, as does one that finds the call ended while
idle (a service restarted between steps: the plan goes to the new process, as a unary call would). Exchanges are serialised (one plan in
flight per worker, as the loop's contract has it). A plan may also be sent ahead and its outcome read
later (``send`` / ``receive``, services/scheduler/run_ahead.py): outcomes come back in plan order, so
an exchange waits for none to be outstanding. A plan sent with ``repeat`` R (services/target/repeat_plan.py)
owes R more outcomes, numbered on from its step, each read by its own ``receive``; ``go_on`` asks for more of
them (TargetPlan.goes_on) before the last one owed is read. ``renew`` moves the stream to a new call (new TLS
credentials) at the next plan that starts with nothing owed, so no outcome is lost to a renewal.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
from opentelemetry import context as otel_context

from services.plan_spans import trace_carrier
from services.scheduler.grpc_workers import WorkerProtocolError, WorkerRpcError
from services.scheduler.wait_deadline import WaitDeadline

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_BREAKS = (TimeoutError, grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError)


def step_error(role: str, method: str, reply: Any) -> WorkerRpcError:
    """An outcome's in-band StepError as the unary call's error (the stream stays open)."""
    code = _CODES.get(reply.error.code, grpc.StatusCode.UNKNOWN)
    return WorkerRpcError(role, method, rpc_error(code, reply.error.message))


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def _core_failure(err: grpc.aio.AioRpcError) -> bool:
    """grpc.aio's own INTERNAL when a write meets a connection the peer tore down (a restart mid-stream): the
    stream broke, as UNAVAILABLE says; a service's own errors come in band (StepError)."""
    return err.code() == grpc.StatusCode.INTERNAL and (err.details() or "").startswith("Internal error from Core")


class PlanStream:
    def __init__(self, role: str, method: str, open_call: Callable[[], Any], timeout_s: float | None) -> None:
        self.role, self.method = role, method
        self._open_call = open_call
        self.timeout_s = timeout_s
        self._call: Any = None
        self._lock = asyncio.Lock()
        self._step = 0
        self._ahead: int | None = None  # the step of a plan sent whose outcome is not read yet
        self._owed = 0  # continuation outcomes still owed after that one (TargetPlan.repeat)
        self._continuing = False  # those are owed by an exchanged plan (read by receive_continuation)
        self._deadline = WaitDeadline()  # asyncio.timeout's behaviour, one timer for every wait (wait_deadline.py)
        self._renewed: asyncio.Event | None = None  # renew(): set once the call has moved to a new one
        self._then: deque = deque()  # outcomes that came with the last one read (TargetOutcome.then), in step order
        self.num_opened = 0  # calls opened so far (1 + reconnects)
        self.bytes_out = 0  # plan bytes written, all time
        self.bytes_in = 0  # outcome bytes read, all time
        self.messages_in = 0  # outcome messages read, all time (fewer than outcomes where some came together)

    @property
    def busy(self) -> bool:
        """An exchange is under way, or a plan's outcome is owed."""
        return self._lock.locked() or self._ahead is not None

    @property
    def locked(self) -> bool:
        return self._lock.locked()

    @property
    def owes(self) -> bool:
        """An outcome is owed: a plan sent ahead, or a continuation of a repeated plan."""
        return self._ahead is not None

    @property
    def renewing(self) -> bool:
        """The call is to move to a new one (``renew``): nothing more should be asked of the old one."""
        return self._renewed is not None

    def renew(self) -> asyncio.Event:
        """Move to a new call (``open_call`` now dials new credentials) at the next plan that starts with nothing
        owed: the outcomes still owed are read on the old call first, and it is cancelled then. The event is set once
        the old call is left (the moment to close its channel)."""
        if self._renewed is None:
            self._renewed = asyncio.Event()
        return self._renewed

    async def exchange(self, plan: Any) -> Any:
        async with self._lock:
            while self._ahead is not None and self._continuing:  # continuations nobody read: the loop moved on
                await self._receive_locked(self._ahead, in_band_errors=False)
            if self._ahead is not None:
                raise RuntimeError(f"{self.role} {self.method}: an exchange while plan {self._ahead} awaits its outcome")
            call = self._prepare(plan)
            try:
                with self._deadline.within(self.timeout_s):  # one deadline for write and read; no task, unlike wait_for
                    await call.write(plan)
                    reply = await call.read()
            except _BREAKS as err:
                raise self._broken(err) from None
            except asyncio.CancelledError as err:
                raise self._cancelled(call, err) from None
            self._advance(plan.step)
            self._continuing = self._ahead is not None
            return self._check(reply, plan.step, in_band_errors=True)

    async def receive_continuation(self) -> Any:
        """The outcome of the next continuation step owed by an exchanged plan (TargetPlan.repeat)."""
        async with self._lock:
            if self._ahead is None or not self._continuing:
                raise WorkerRpcError(self.role, self.method, rpc_error(grpc.StatusCode.UNAVAILABLE,
                                                                      "no continuation step is owed"))  # fmt: skip
            return await self._receive_locked(self._ahead, in_band_errors=True)

    async def go_on(self, plan: Any) -> None:
        """Write a plan that goes on (TargetPlan.goes_on): 1 + ``plan.repeat`` more continuation steps after those
        owed, each read by its own ``receive_continuation``. Written while the last one owed may still run, so the
        target never waits for a plan."""
        async with self._lock:
            if self._ahead is None:
                raise WorkerRpcError(self.role, self.method, rpc_error(grpc.StatusCode.UNAVAILABLE,
                                                                      "no continuation step to go on from"))  # fmt: skip
            plan.step = self._step + 1  # numbered on from the last outcome owed
            self._step += 1 + plan.repeat
            self._owed += 1 + plan.repeat
            carrier = trace_carrier()
            if carrier:
                plan.trace_context.update(carrier)
            self.bytes_out += plan.ByteSize()
            call = self._call
            try:
                with self._deadline.within(self.timeout_s):
                    await call.write(plan)
            except _BREAKS as err:
                raise self._broken(err) from None
            except asyncio.CancelledError as err:
                raise self._cancelled(call, err) from None

    def _advance(self, step: int) -> None:
        """The outcome of ``step`` is read: the next one owed, if a continuation follows."""
        self._ahead = None
        if self._owed:
            self._owed -= 1
            self._ahead = step + 1

    async def send(self, plan: Any) -> int:
        """Write one plan (opening the call if needed); its outcome is ``receive(step)``'s, in plan order (and with
        ``repeat``, those of its continuations: ``receive(step + 1)`` ...)."""
        call = self._prepare(plan)
        self._continuing = False
        try:
            with self._deadline.within(self.timeout_s):
                await call.write(plan)
        except _BREAKS as err:
            raise self._broken(err) from None
        except asyncio.CancelledError as err:
            raise self._cancelled(call, err) from None
        return plan.step

    async def receive(self, step: int, *, in_band_errors: bool = True) -> Any:
        """The outcome of plan ``step``, the oldest sent; a StepError in it raises (``in_band_errors``)."""
        return await self._receive_locked(step, in_band_errors=in_band_errors)

    async def _receive_locked(self, step: int, *, in_band_errors: bool) -> Any:
        call = self._call
        self._advance(step)
        if call is None:  # dropped since the plan left (a failed write)
            raise WorkerRpcError(self.role, self.method, rpc_error(grpc.StatusCode.UNAVAILABLE, "the step stream broke"))
        if self._then:  # it came with the last one read (services/target/outcome_hold.py)
            return self._check(self._then.popleft(), step, in_band_errors=in_band_errors, counted=True)
        try:
            with self._deadline.within(self.timeout_s):
                reply = await call.read()
        except _BREAKS as err:
            raise self._broken(err) from None
        except asyncio.CancelledError as err:
            raise self._cancelled(call, err) from None
        return self._check(reply, step, in_band_errors=in_band_errors)

    def _prepare(self, plan: Any) -> Any:
        """Number the plan, add the trace context, count its bytes; the call to write it on."""
        self._step += 1
        plan.step = self._ahead = self._step
        self._owed = getattr(plan, "repeat", 0)  # continuation outcomes owed after this one, numbered on
        self._step += self._owed
        carrier = trace_carrier()
        if carrier:
            plan.trace_context.update(carrier)
        self.bytes_out += plan.ByteSize()
        if self._renewed is not None and self._call is not None:  # nothing is owed on it any more (renew)
            call, self._call = self._call, None
            call.cancel()
        if self._call is not None and self._call.done():  # it ended while idle (the service restarted): dial again,
            self._call = None  # as a unary call would; what the old peer held is its errors' to tell (unknown ids)
        return self._call if self._call is not None else self._open()

    def _check(self, reply: Any, step: int, *, in_band_errors: bool, counted: bool = False) -> Any:
        if reply is grpc.aio.EOF:
            self.drop()
            raise WorkerRpcError(self.role, self.method,
                                 rpc_error(grpc.StatusCode.UNAVAILABLE, "the step stream ended"))  # fmt: skip
        if not counted:  # a message as read (with the outcomes it carries)
            self.bytes_in += reply.ByteSize()
            self.messages_in += 1
            if getattr(reply, "then", None):
                self._then.extend(reply.then)
        if reply.step != step:
            self.drop()
            raise WorkerProtocolError(f"{self.role} {self.method}: outcome of step {reply.step} for plan {step}")
        if in_band_errors and reply.HasField("error"):
            raise step_error(self.role, self.method, reply)
        return reply

    def _broken(self, err: BaseException) -> WorkerRpcError:
        """A write or read that timed out or broke: the call is dropped; the unary protocol's error."""
        self.drop()
        if isinstance(err, TimeoutError):
            return WorkerRpcError(self.role, self.method, rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no step outcome within {self.timeout_s:g} s"))
        if isinstance(err, grpc.aio.AioRpcError) and not _core_failure(err):
            return WorkerRpcError(self.role, self.method, err)
        return WorkerRpcError(self.role, self.method, rpc_error(grpc.StatusCode.UNAVAILABLE, str(err)))  # a call already done

    def _cancelled(self, call: Any, err: asyncio.CancelledError) -> BaseException:
        """What a wait on ``call`` that ended in ``err`` raises: for a call cancelled under it (``drop``, ``close``:
        grpc.aio ends a local cancel's read or write so), a break like any other; ``err`` itself where this task is
        the one cancelled."""
        task = asyncio.current_task()
        if not call.cancelled() or (task is not None and task.cancelling()):
            return err
        if self._call is call:
            self.drop()
        return WorkerRpcError(self.role, self.method, rpc_error(grpc.StatusCode.UNAVAILABLE,
                                                                "the step stream was cancelled"))  # fmt: skip

    def _open(self) -> Any:
        token = otel_context.attach(otel_context.Context())  # no trace: the stream outlives every request
        try:
            self._call = self._open_call()
        finally:
            otel_context.detach(token)
        self.num_opened += 1
        if self._renewed is not None:  # the new call dialled the new credentials
            self._renewed, renewed = None, self._renewed
            renewed.set()
        return self._call

    def drop(self) -> None:
        """Forget the call (cancelled if still open) and any outcome owed; the next exchange opens a new one."""
        call, self._call, self._ahead, self._owed, self._continuing = self._call, None, None, 0, False
        self._then.clear()
        if call is not None:
            call.cancel()

    async def close(self) -> None:
        """Half-close the call and let the service end it."""
        call, self._call = self._call, None
        self._then.clear()
        if call is not None:
            try:
                await asyncio.wait_for(call.done_writing(), 1.0)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.TimeoutError, asyncio.InvalidStateError):
                pass
            call.cancel()
