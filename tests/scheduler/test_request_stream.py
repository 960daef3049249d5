"""RequestStream: a request's events in order, to a reader that waits, is cancelled, or collects them all."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.request import FinishReason, Request, RequestState
from scheduler.request_stream import RequestStream, TokenEvent


def _event(index: int, tokens: list[int], finished: bool = False) -> TokenEvent:
    state = RequestState.FINISHED if finished else RequestState.RUNNING
    return TokenEvent("r", tokens, index, 0.0, state, finished=finished,
                      finish_reason=FinishReason.LENGTH if finished else None)  # fmt: skip


def _stream() -> RequestStream:
    return RequestStream(Request(id="r", prompt_ids=[1, 2], max_new_tokens=8))


def _read_into(stream: RequestStream, got: list[TokenEvent]) -> asyncio.Task:
    """A reader task that iterates ``stream`` and keeps every event it gets, in order."""

    async def read():
        async for ev in stream:
            got.append(ev)

    return asyncio.create_task(read())


def test_events_come_in_order_and_the_stream_stops_after_the_finished_one():
    async def main():
        stream = _stream()
        got: list[TokenEvent] = []
        reader = _read_into(stream, got)
        await asyncio.sleep(0)  # the reader waits on an empty stream
        stream._put(_event(0, [5]))
        stream._put(_event(1, [6, 7]))  # two before it wakes: both come, in order
        await asyncio.sleep(0)
        stream._put(_event(3, [8], finished=True))
        await asyncio.wait_for(reader, 1)
        assert [e.token_ids for e in got] == [[5], [6, 7], [8]] and got[-1].finished
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()

    asyncio.run(main())


def test_collect_takes_every_queued_event_and_ignores_none_after_the_end():
    async def main():
        stream = _stream()
        stream._put(_event(0, [5]))
        task = asyncio.create_task(stream.collect())
        await asyncio.sleep(0)
        stream._put(_event(1, [6]))
        stream._put(_event(2, [7], finished=True))
        stream._put(_event(3, [99]))  # nothing follows the finished event
        assert await asyncio.wait_for(task, 1) == [5, 6, 7]

    asyncio.run(main())


def test_a_reader_cancelled_while_waiting_leaves_the_stream_usable():
    async def main():
        stream = _stream()
        waiting = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        stream._put(_event(0, [5], finished=True))  # no waiter left to wake: the event stays queued
        assert (await stream.__anext__()).token_ids == [5]

    asyncio.run(main())


def test_a_final_only_reader_is_woken_once_by_the_end_and_reads_every_event_in_order():
    async def main():
        stream = _stream().final_only()
        got: list[TokenEvent] = []
        reader = _read_into(stream, got)
        for i in range(3):  # a step each: queued, nobody woken
            await asyncio.sleep(0)
            stream._put(_event(i, [5 + i]))
            await asyncio.sleep(0)
            assert got == [] and stream._waiter is not None and not stream._waiter.done()
        stream._put(_event(3, [8], finished=True))
        await asyncio.wait_for(reader, 1)
        assert [e.token_ids for e in got] == [[5], [6], [7], [8]] and got[-1].finished

    asyncio.run(main())


def test_collect_waits_for_the_end_alone():
    async def main():
        stream = _stream()
        task = asyncio.create_task(stream.collect())
        await asyncio.sleep(0)
        waiter = stream._waiter
        stream._put(_event(0, [5]))
        stream._put(_event(1, [6]))
        await asyncio.sleep(0)
        assert stream._waiter is waiter and not waiter.done() and not task.done()  # still the first wait
        stream._put(_event(2, [7], finished=True))
        assert await asyncio.wait_for(task, 1) == [5, 6, 7]

    asyncio.run(main())
