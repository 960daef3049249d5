"""A handler's answers written by a task of their own (services/stream_writer.py): in order, all of them before
the call ends, and a failed write stops the handler."""

from __future__ import annotations

import asyncio

import pytest

from services.stream_writer import StreamWriter


class _Context:
    def __init__(self, fail_at: int | None = None) -> None:
        self.written: list[int] = []
        self.fail_at = fail_at

    async def write(self, msg: int) -> None:
        await asyncio.sleep(0.001)  # a write completes later, as gRPC's does
        if msg == self.fail_at:
            raise ConnectionError("peer gone")
        self.written.append(msg)


def test_answers_leave_in_order_while_the_handler_goes_on_and_all_before_the_call_ends():
    async def main():
        ctx = _Context()
        writer = StreamWriter(ctx)
        for i in range(50):
            writer.put(i)  # does not wait for the write
        queued_at_once = len(ctx.written) < 50
        await writer.close()
        return ctx.written, queued_at_once

    written, queued_at_once = asyncio.run(main())
    assert written == list(range(50)) and queued_at_once


def test_a_failed_write_fails_the_next_put():
    async def main():
        writer = StreamWriter(_Context(fail_at=3))
        for i in range(4):
            writer.put(i)
        await asyncio.sleep(0.05)
        with pytest.raises(ConnectionError):
            writer.put(4)
        await writer.close()  # quietly: the call is ending anyway

    asyncio.run(main())
