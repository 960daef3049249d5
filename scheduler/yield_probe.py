"""Whether a coroutine gave the event loop a turn since a mark: a callback queued at the mark runs only then.

    waited = probe.mark(loop)
    await self.step()
    if not waited():          # it never yielded (an in-process worker): give the others a turn now
        await asyncio.sleep(0)

One ``call_soon`` per mark; the scheduler's loop skips its per-step ``sleep(0)`` when the step
already waited for its workers, so stream consumers and submitters ran then, beside the workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class YieldProbe:
    def __init__(self) -> None:
        self._ran = False

    def mark(self, loop: asyncio.AbstractEventLoop) -> Callable[[], bool]:
        self._ran = False
        loop.call_soon(self._set)
        return self.ran

    def _set(self) -> None:
        self._ran = True

    def ran(self) -> bool:
        return self._ran
