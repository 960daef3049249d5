"""A bidirectional handler's answers written by a task of their own, in order, while the handler goes on.

    writer = StreamWriter(context)
    try:
        async for plan in request_iterator:
            writer.put(await work(plan))      # queued: the handler reads and works on the next message at once
    finally:
        await writer.close()                  # what is queued is written before the call ends

An async-generator handler waits for each answer's write to complete before it runs again: the write's
completion comes back through gRPC's poller thread and the event loop, 0.05-0.3 ms of wall time on a
2-core host while the next plan is already there. Here the next step runs while the answer leaves.
A write that fails (the peer went away) fails the handler's next ``put``, which ends the call as a
broken stream ends it.
"""

from __future__ import annotations

import asyncio
from typing import Any


class StreamWriter:
    def __init__(self, context, name: str = "stream-writer") -> None:
        self._context = context
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._write(), name=name)

    async def _write(self) -> None:
        while (msg := await self._queue.get()) is not None:
            await self._context.write(msg)

    def put(self, msg: Any) -> None:
        """Queue ``msg``; raises what the writer failed with, if it did."""
        if self._task.done():
            self._task.result()  # raises the write's error (or ends quietly if closed)
            raise RuntimeError("the stream's writer is closed")
        self._queue.put_nowait(msg)

    async def close(self) -> None:
        """Write what is queued, then stop; a writer that failed stops at once."""
        if not self._task.done():
            self._queue.put_nowait(None)
        try:
            await self._task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - the call is ending anyway
            pass
