"""What a submitted request's caller reads: its ``TokenEvent``s, in order, through a ``RequestStream``.

The loop puts an event per request per step, so the stream is a deque and one waiter future, made only
when the reader finds nothing queued (an ``asyncio.Queue`` makes a future for every ``get`` and wakes
its reader through more callbacks). A reader that wants only the whole output asks for ``final_only``
and is woken once, by the finished event.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.request import FinishReason, RequestState

if TYPE_CHECKING:
    from scheduler.request import Request


@dataclass(slots=True)
class TokenEvent:
    """New output tokens of one request, or its end (``finished``); the last event of a stream is finished. A plain
    slotted value, made once per request per step (a frozen dataclass's ``__init__`` costs three times as much)."""

    request_id: str
    token_ids: list[int]
    index: int  # position of token_ids[0] in the request's output
    time: float  # scheduler clock when emitted
    state: RequestState
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_code: str | None = None


class RequestStream:
    """Async iterator over one request's ``TokenEvent``s; stops after the finished event."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self._events: deque[TokenEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None  # the reader's, while it waits for an event
        self._done = False
        self._final_only = False  # the reader is woken by the finished event alone (final_only)

    def _put(self, event: TokenEvent) -> None:
        self._events.append(event)
        if self._final_only and not event.finished:
            return
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def final_only(self) -> RequestStream:
        """Wake the reader once, at the end, for one that returns the whole output (``collect``, a unary
        ``GenerateUnary``, a non-streaming HTTP request): the loop still queues an event per step, in order, but
        sets no waiter until the finished event, so a batch of B such readers costs no B task wake-ups per step
        (vLLM's FINAL_ONLY outputs). Its events are all read then, as before."""
        self._final_only = True
        return self

    def __aiter__(self) -> RequestStream:
        return self

    async def _wait(self) -> None:
        while not self._events:
            self._waiter = waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting
                    self._waiter = None

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        if not self._events:
            await self._wait()
        event = self._events.popleft()
        self._done = event.finished
        return event

    async def collect(self) -> list[int]:
        """All output tokens, once the request ends (every event queued is taken at each wake-up)."""
        out: list[int] = []
        events = self._events
        self.final_only()
        while not self._done:
            if not events:
                await self._wait()
            while events and not self._done:
                event = events.popleft()
                out.extend(event.token_ids)
                self._done = event.finished
        return out
