"""The draft's inbox of pushed feature rows: joined by position, waited for while in flight, missing after the wait."""

from __future__ import annotations

import asyncio

from services.draft.feature_inbox import FeatureInbox
from shared.engine.features import FeatureBlock


def rows(start: int, n: int, fill: int = 1) -> FeatureBlock:
    return FeatureBlock(start, n, 2, "float16", bytes([fill]) * (4 * n))


def test_rows_of_consecutive_pushes_are_taken_as_one_block():
    async def main():
        inbox = FeatureInbox(wait_s=0.01)
        inbox.put("s", rows(0, 3))
        inbox.put("s", rows(3, 2, fill=2))
        block = await inbox.take("s", 1, 5)
        assert (block.start, block.num_rows, block.data) == (1, 4, b"\x01" * 8 + b"\x02" * 8)
        assert await inbox.take("s", 0, 1) is None  # taken past: dropped

    asyncio.run(main())


def test_a_take_waits_for_rows_still_in_flight_and_misses_after_the_wait():
    async def main():
        inbox = FeatureInbox(wait_s=1.0)
        later = asyncio.get_running_loop().call_later(0.05, inbox.put, "s", rows(0, 2))
        assert (await inbox.take("s", 0, 2)).num_rows == 2
        later.cancel()
        inbox.wait_s = 0.05
        assert await inbox.take("s", 2, 3) is None  # never pushed
        assert await inbox.take("other", 0, 1) is None

    asyncio.run(main())


def test_released_sequences_and_the_oldest_past_the_cap_are_dropped():
    async def main():
        inbox = FeatureInbox(wait_s=0.01, max_bytes=8)
        inbox.put("a", rows(0, 2))
        inbox.put("b", rows(0, 2))  # 16 bytes held: "a", the oldest, goes
        assert await inbox.take("a", 0, 1) is None and (await inbox.take("b", 0, 2)).num_rows == 2
        inbox.forget(["b"])
        assert await inbox.take("b", 0, 1) is None

    asyncio.run(main())
