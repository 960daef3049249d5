"""Feature rows through a shared-memory ring (shared/rpc/shared_rows.py): what goes in comes out, the target
never writes over rows the draft has not read, and a ring the draft cannot read is an error, not a hang."""

from __future__ import annotations

import pytest

from shared.engine.features import FeatureBlock
from shared.rpc.shared_rows import HEADER, RingReader, RowRing, host_id


def rows(start: int, n: int, fill: int) -> FeatureBlock:
    return FeatureBlock(start, n, 4, "float16", bytes([fill]) * (8 * n))


def empty(block: FeatureBlock) -> FeatureBlock:
    """The block as the draft gets it over the wire: header only."""
    return FeatureBlock(block.start, block.num_rows, block.width, block.dtype, b"", pushed=True)


@pytest.fixture
def ring():
    ring = RowRing.create(capacity=100)
    yield ring
    ring.close()


def test_rows_written_come_out_and_the_ring_wraps_without_splitting_a_block(ring):
    reader = RingReader()
    try:
        for step in range(12):  # 40 + 16 bytes a step: wraps every other step
            blocks = [rows(step * 5, 5, step), rows(0, 2, 100 + step)]
            positions = ring.write(blocks)
            assert positions is not None and all(p % 100 + len(b.data) <= 100 for p, b in zip(positions, blocks))
            got = reader.read(ring.name, ring.capacity, positions, [empty(b) for b in blocks])
            assert got == blocks
        assert ring.consumed() == ring.position
    finally:
        reader.close()


def test_the_target_writes_nothing_over_rows_not_yet_read(ring):
    reader = RingReader()
    try:
        first = ring.write([rows(0, 5, 1)])  # 40 bytes
        second = ring.write([rows(5, 5, 2)])  # 80 of 100 unread
        assert first is not None and second is not None
        assert ring.write([rows(10, 5, 3)]) is None  # would reach into the first push: it goes inline instead
        assert ring.write([rows(0, 20, 3)]) is None  # larger than the ring
        reader.read(ring.name, ring.capacity, first, [empty(rows(0, 5, 1))])
        third = ring.write([rows(10, 5, 3)])
        assert third is not None and third[0] % 100 == 0  # at the start: 20 bytes left at the end are too few
        assert reader.read(ring.name, ring.capacity, second + third, [empty(rows(5, 5, 2)), empty(rows(10, 5, 3))]) == [
            rows(5, 5, 2), rows(10, 5, 3)]
    finally:
        reader.close()


def test_a_ring_that_is_gone_or_inconsistent_is_an_error(ring):
    reader = RingReader()
    try:
        with pytest.raises(FileNotFoundError):
            reader.read("tandem-rows-none", 100, [0], [empty(rows(0, 1, 1))])
        with pytest.raises(ValueError):
            reader.read(ring.name, 10_000, [0], [empty(rows(0, 1, 1))])  # more than the segment holds
        with pytest.raises(ValueError):
            reader.read(ring.name, 100, [96], [empty(rows(0, 1, 1))])  # a block past the end
        assert ring.segment.size >= HEADER + 100
    finally:
        reader.close()


def test_this_process_has_a_host_id_that_a_second_process_shares():
    import subprocess
    import sys

    mine = host_id()
    other = subprocess.run([sys.executable, "-c", "from shared.rpc.shared_rows import host_id; print(host_id())"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert mine and other == mine
