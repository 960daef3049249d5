"""PlanStream's failures read as the unary calls' did, and plans sent ahead come back in order.

A fake bidirectional call stands in for grpc.aio's (the real stream is exercised over loopback in
tests/services/test_step_stream_recovery.py and test_run_ahead.py); these cases are hard to provoke there.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from services.scheduler.grpc_workers import WorkerProtocolError, WorkerRpcError
from services.scheduler.plan_stream import PlanStream
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2


class FakeCall:
    """Echoes each plan's step in an outcome; ``answer`` rewrites an outcome (or returns EOF / raises)."""

    def __init__(self, answer=None, hang: bool = False) -> None:
        self.sent: list[int] = []
        self.answer = answer or (lambda out: out)
        self.hang = hang
        self.was_cancelled = False
        self.ended = False  # the peer ended the call (it restarted)
        self._reading: asyncio.Future | None = None  # a read under way (cancel ends it as grpc.aio does)

    async def write(self, plan) -> None:
        self.sent.append(plan.step)

    async def read(self):
        if self.hang:
            self._reading = asyncio.get_running_loop().create_future()
            await asyncio.wait_for(self._reading, 10)
        return self.answer(target_pb2.TargetOutcome(step=self.sent.pop(0)))

    def cancel(self) -> None:
        self.was_cancelled = True
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()  # grpc.aio: a read under a local cancel ends in CancelledError

    def cancelled(self) -> bool:
        return self.was_cancelled

    def done(self) -> bool:
        return self.was_cancelled or self.ended


def stream_of(call: FakeCall, timeout_s: float = 1.0) -> PlanStream:
    return PlanStream("target", "StepStream", lambda: call, timeout_s)


def test_plans_sent_ahead_come_back_in_order_and_an_exchange_waits_for_none():
    async def main():
        call = FakeCall()
        stream = stream_of(call)
        first = await stream.send(target_pb2.TargetPlan())
        assert stream.busy and not stream.locked
        with pytest.raises(RuntimeError, match="awaits its outcome"):
            await stream.exchange(target_pb2.TargetPlan())
        assert (await stream.receive(first)).step == first and not stream.busy
        assert (await stream.exchange(target_pb2.TargetPlan())).step == first + 1  # the refused one was not numbered

    asyncio.run(main())


@pytest.mark.parametrize(
    "answer, hang, error, code",
    [
        (None, True, WorkerRpcError, grpc.StatusCode.DEADLINE_EXCEEDED),  # no outcome within the deadline
        (lambda out: grpc.aio.EOF, False, WorkerRpcError, grpc.StatusCode.UNAVAILABLE),  # the stream ended
        (lambda out: target_pb2.TargetOutcome(step=out.step + 5), False, WorkerProtocolError, None),  # another step
    ],
)
def test_a_broken_exchange_drops_the_call_with_the_unary_error(answer, hang, error, code):
    async def main():
        call = FakeCall(answer, hang)
        stream = stream_of(call, timeout_s=0.05)
        with pytest.raises(error) as info:
            await stream.exchange(target_pb2.TargetPlan())
        return call, stream, info.value

    call, stream, err = asyncio.run(main())
    assert call.was_cancelled and stream._call is None and not stream.busy  # the next plan opens a new call
    if code is not None:
        assert err.code() is code


def test_a_step_error_raises_its_status_and_keeps_the_stream():
    def refuse(out):
        out.error.CopyFrom(common_pb2.StepError(code=grpc.StatusCode.NOT_FOUND.value[0], message="unknown sequence"))
        return out

    async def main():
        call = FakeCall(refuse)
        stream = stream_of(call)
        with pytest.raises(WorkerRpcError) as info:
            await stream.exchange(target_pb2.TargetPlan())
        step = await stream.send(target_pb2.TargetPlan())
        reply = await stream.receive(step, in_band_errors=False)  # a plan sent ahead reads its error itself
        return call, stream, info.value, reply

    call, stream, err, reply = asyncio.run(main())
    assert err.code() is grpc.StatusCode.NOT_FOUND and "unknown sequence" in err.details()
    assert not call.was_cancelled and stream._call is call and reply.HasField("error")


def test_a_call_that_ended_while_idle_is_dialled_again_before_the_next_plan():
    """A service that restarted between steps ended the stream: the next plan goes on a new call, as a unary
    call would dial again (what the old process held, its errors tell: unknown sequences)."""
    calls = [FakeCall(), FakeCall()]
    opened = iter(calls)
    stream = PlanStream("draft", "SpeculateStream", lambda: next(opened), 1.0)

    async def main():
        await stream.exchange(target_pb2.TargetPlan())
        calls[0].ended = True
        return await stream.exchange(target_pb2.TargetPlan())

    assert asyncio.run(main()).step == 2
    assert stream.num_opened == 2 and calls[1].sent == [] and calls[0].sent == []


def test_a_write_on_a_torn_down_connection_is_an_outage_not_an_internal_error():
    """grpc.aio answers a write that meets a connection the peer tore down (a restart mid-stream) with INTERNAL
    "Internal error from Core": the loop must read it as the target gone (wait, re-prefill), not fail requests."""
    def torn(out):
        raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                   "Internal error from Core")

    stream = stream_of(FakeCall(answer=torn))
    with pytest.raises(WorkerRpcError) as err:
        asyncio.run(stream.exchange(target_pb2.TargetPlan()))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_call_dropped_under_a_read_is_a_break_not_a_cancelled_task():
    """Another task drops the call while an outcome is awaited (grpc.aio ends that read in CancelledError): the
    read raises the broken stream's UNAVAILABLE, so the loop recovers as from any break; a cancel of the reading
    task itself still cancels it."""
    async def main():
        call = FakeCall(hang=True)
        stream = stream_of(call, timeout_s=5.0)
        reading = asyncio.create_task(stream.exchange(target_pb2.TargetPlan()))
        await asyncio.sleep(0.01)
        stream.drop()
        with pytest.raises(WorkerRpcError) as err:
            await reading
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and stream._call is None
        other = stream_of(FakeCall(hang=True), timeout_s=5.0)
        reading = asyncio.create_task(other.exchange(target_pb2.TargetPlan()))
        await asyncio.sleep(0.01)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(main())


def test_renew_moves_to_a_new_call_once_nothing_is_owed():
    """A renewal (new TLS credentials) reads what the old call owes first, then the next plan opens a new call and
    the old one is cancelled: no outcome is lost, and the event tells when the old channel may close."""
    calls = [FakeCall(), FakeCall()]
    opened = iter(calls)
    stream = PlanStream("target", "StepStream", lambda: next(opened), 1.0)

    async def main():
        first = await stream.send(target_pb2.TargetPlan(repeat=1))  # two outcomes owed on the first call
        left = stream.renew()
        assert stream.renewing and stream.renew() is left
        calls[0].sent.append(first + 1)  # the continuation's outcome, as the target would write it
        assert (await stream.receive(first)).step == first
        assert (await stream.receive(first + 1)).step == first + 1 and not left.is_set()
        assert (await stream.exchange(target_pb2.TargetPlan())).step == first + 2
        return left

    left = asyncio.run(main())
    assert left.is_set() and not stream.renewing and stream.num_opened == 2
    assert calls[0].was_cancelled and not calls[1].was_cancelled


class BundlingCall(FakeCall):
    """Answers a plan with ``repeat`` R by its R + 1 outcomes, the first two in one message (outcome_hold.py)."""

    async def write(self, plan) -> None:
        self.sent.append((plan.step, plan.repeat))

    async def read(self):
        if not self.sent:
            return grpc.aio.EOF
        step, repeat = self.sent[0]
        if isinstance(step, list):  # the rest of a plan's outcomes, one by one
            out = target_pb2.TargetOutcome(step=step.pop(0))
            if not step:
                self.sent.pop(0)
            return out
        first = target_pb2.TargetOutcome(step=step)
        first.then.add(step=step + 1)
        rest = list(range(step + 2, step + 1 + repeat))
        if rest:
            self.sent[0] = (rest, None)
        else:
            self.sent.pop(0)
        return first


def test_outcomes_that_come_together_are_read_one_by_one_in_step_order():
    async def main():
        call = BundlingCall()
        stream = stream_of(call)
        step = await stream.send(target_pb2.TargetPlan(repeat=3))
        steps = [(await stream.receive(step + k)).step for k in range(4)]
        assert steps == [step, step + 1, step + 2, step + 3] and not stream.owes
        counted = stream.bytes_in
        # a plan that goes on after them is read the same way, and the bytes of a message count once
        await stream.exchange(target_pb2.TargetPlan(repeat=1))  # reads its first outcome (carrying the second)
        assert (await stream.receive_continuation()).step == step + 5 and not stream.owes
        assert stream.bytes_in - counted == target_pb2.TargetOutcome(step=step + 4, then=[
            target_pb2.TargetOutcome(step=step + 5)]).ByteSize()  # fmt: skip
        return call

    asyncio.run(main())


def test_outcomes_left_from_a_dropped_call_are_not_read_on_the_next():
    async def main():
        call = BundlingCall()
        stream = stream_of(call)
        step = await stream.send(target_pb2.TargetPlan(repeat=1))
        assert (await stream.receive(step)).step == step  # the second came with it
        stream.drop()  # the stream broke: what it owed is gone with it
        call.was_cancelled, call.sent = False, []
        nxt = await stream.send(target_pb2.TargetPlan())
        call.sent = [(nxt, 1)]
        assert (await stream.receive(nxt)).step == nxt  # not the dropped call's outcome of step + 1

    asyncio.run(main())
