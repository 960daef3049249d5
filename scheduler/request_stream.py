"""What a submitted request's caller reads: its ``TokenEvent``s, in order, through a ``RequestStream``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scheduler.request import FinishReason, RequestState

if TYPE_CHECKING:
    from scheduler.request import Request


@dataclass(frozen=True)
class TokenEvent:
    """New output tokens of one request, or its end (``finished``); the last event of a stream is finished."""

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
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._done = False

    def _put(self, event: TokenEvent) -> None:
        self._queue.put_nowait(event)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> TokenEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        self._done = event.finished
        return event

    async def collect(self) -> list[int]:
        """All output tokens, once the request ends."""
        out: list[int] = []
        async for ev in self:
            out.extend(ev.token_ids)
        return out
