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


def test_with_no_push_stream_open_a_take_waits_only_the_grace():
    """A restarted draft (the target's rows went into the old connection) misses at once, not after wait_s."""

    async def main():
        loop = asyncio.get_running_loop()
        inbox = FeatureInbox(wait_s=30.0, grace_s=0.05)
        t0 = loop.time()
        assert await inbox.take("s", 0, 1) is None
        assert loop.time() - t0 < 5.0  # the grace, not the 30 s wait
        with inbox.feed():  # a stream is open: rows in flight are waited for past the grace
            loop.call_later(0.2, inbox.put, "s", rows(0, 1))
            assert (await inbox.take("s", 0, 1)).num_rows == 1

    asyncio.run(main())


def test_a_stream_that_closes_ends_the_wait_for_its_rows():
    async def main():
        loop = asyncio.get_running_loop()
        inbox = FeatureInbox(wait_s=30.0, grace_s=0.05)
        feed = inbox.feed()
        feed.__enter__()
        loop.call_later(0.05, feed.__exit__, None, None, None)  # the target's stream breaks
        t0 = loop.time()
        assert await inbox.take("s", 0, 1) is None
        assert loop.time() - t0 < 5.0 and inbox.feeds == 0

    asyncio.run(main())


def test_one_deadline_bounds_a_whole_plan():
    async def main():
        loop = asyncio.get_running_loop()
        inbox = FeatureInbox(wait_s=1.0)
        with inbox.feed():
            deadline, t0 = inbox.deadline(), loop.time()
            for seq in "abcde":  # five sequences whose rows never come: 1 s in all, not 5 s
                assert await inbox.take(seq, 0, 1, deadline) is None
            assert loop.time() - t0 < 4.0

    asyncio.run(main())


def test_a_take_of_exactly_the_last_push_is_that_block_without_a_copy():
    """Each step's plan asks for the rows its last push carried: the inbox hands over that block itself."""

    async def main():
        inbox = FeatureInbox(wait_s=0.01)
        first, second = rows(0, 3), rows(3, 2, fill=2)
        inbox.put("s", first)
        assert await inbox.take("s", 0, 3) is first
        inbox.put("s", second)
        assert await inbox.take("s", 3, 5) is second
        assert inbox._bytes == len(second.data)  # the rows taken past are gone
        inbox.put("s", rows(4, 2, fill=3))  # a newer push from position 4 overrides the row it shares
        block = await inbox.take("s", 3, 6)
        assert (block.start, block.data) == (3, b"\x02" * 4 + b"\x03" * 8)
        inbox.put("s", rows(9, 1))  # a gap (rows lost in flight): only the newest is kept
        assert await inbox.take("s", 5, 6) is None and (await inbox.take("s", 9, 10)).num_rows == 1

    asyncio.run(main())
