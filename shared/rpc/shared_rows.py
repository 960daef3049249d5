"""Feature rows through shared memory between a target and a draft on the same host.

    target: ring = RowRing.create(64 << 20)            draft: reader = RingReader()
            positions = ring.write(blocks)  ─FeaturePush(shared = name, positions; blocks without data)─▶
                                                            blocks = reader.read(push.shared, push.blocks)

At a hidden size of 4,096 a step's rows are about 4 MB (32 sequences, 5 rows of 3 layers in float16); over
gRPC on loopback that is milliseconds of framing and copies on each side. In a ring they are one copy in
and one copy out. The ring is a byte stream laid over the segment's data area (a block never wraps: it
starts at the beginning when it does not fit before the end); its header holds how far the draft has read::

    [0, 8)    consumed: the draft's read position (little-endian uint64), written after it copied a push out
    [64, ..)  rows

The target writes a push only where nothing unread lies (``position - consumed <= capacity``), else it
sends that push's rows inline, as it does for a draft on another host. ``host_id`` says whether two
processes share memory: the same boot and the same /dev/shm (a container with its own /dev/shm differs).
"""

from __future__ import annotations

import os
import secrets
from multiprocessing import resource_tracker, shared_memory

from shared.engine.features import FeatureBlock

HEADER = 64
DEFAULT_CAPACITY = 64 << 20
MAX_OPEN = 4  # rings a draft keeps open (one per target pushing to it)


def host_id() -> str:
    """The boot and the /dev/shm mount of this process: equal ids can open each other's segments."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        shm = os.stat("/dev/shm")
    except OSError:
        return ""  # no /dev/shm (not Linux): never shared
    return f"{boot}:{shm.st_dev}:{shm.st_ino}"


class RowRing:
    """The target's side: a segment it owns (unlinked at ``close``, or by the resource tracker if it dies)."""

    def __init__(self, segment: shared_memory.SharedMemory, capacity: int) -> None:
        self.segment = segment
        self.capacity = capacity
        self.position = 0  # the byte stream's end: where the next block goes
        self.bytes_written = 0

    @classmethod
    def create(cls, capacity: int = DEFAULT_CAPACITY) -> "RowRing":
        name = f"tandem-rows-{os.getpid()}-{secrets.token_hex(4)}"
        return cls(shared_memory.SharedMemory(name=name, create=True, size=HEADER + capacity), capacity)

    @property
    def name(self) -> str:
        return self.segment.name

    def consumed(self) -> int:
        return int.from_bytes(self.segment.buf[0:8], "little")

    def write(self, blocks: list[FeatureBlock]) -> list[int] | None:
        """Each block's position in the stream, its rows copied in; None (nothing written) where the draft has
        not yet read what they would overwrite, or a block is larger than the ring."""
        cap, pos, positions = self.capacity, self.position, []
        for block in blocks:
            n = len(block.data)
            if n > cap:
                return None
            if pos % cap + n > cap:  # never wrap a block: start it at the beginning
                pos += cap - pos % cap
            positions.append(pos)
            pos += n
        if pos - self.consumed() > cap:
            return None
        buf = self.segment.buf
        for block, at in zip(blocks, positions):
            off = HEADER + at % cap
            buf[off : off + len(block.data)] = block.data
        self.position = pos
        self.bytes_written += sum(len(b.data) for b in blocks)
        return positions

    def close(self) -> None:
        try:
            self.segment.close()
            self.segment.unlink()
        except (FileNotFoundError, BufferError):
            pass


class RingReader:
    """The draft's side: the rings it has opened, by name (a restarted target makes a new one)."""

    def __init__(self) -> None:
        self._open: dict[str, shared_memory.SharedMemory] = {}

    def read(self, name: str, capacity: int, positions, blocks: list[FeatureBlock]) -> list[FeatureBlock]:
        """The blocks with their rows copied out of ring ``name`` (each block's data is empty on the wire);
        then the ring's read position moves past them. OSError / ValueError when the ring cannot be read."""
        segment = self._attach(name)
        if segment.size < HEADER + capacity or len(positions) != len(blocks):
            raise ValueError(f"shared rows {name!r}: a ring of {segment.size} bytes, {len(positions)} positions "
                             f"for {len(blocks)} blocks, capacity {capacity}")  # fmt: skip
        buf, out, end = segment.buf, [], int.from_bytes(segment.buf[0:8], "little")
        for block, at in zip(blocks, positions):
            n = block.num_rows * block.row_bytes
            off = HEADER + at % capacity
            if off + n > HEADER + capacity:
                raise ValueError(f"shared rows {name!r}: a block at {at} past the ring's end")
            out.append(FeatureBlock(block.start, block.num_rows, block.width, block.dtype, bytes(buf[off : off + n])))
            end = max(end, at + n)
        buf[0:8] = end.to_bytes(8, "little")  # after the copies: the target may write over them now
        return out

    def _attach(self, name: str) -> shared_memory.SharedMemory:
        segment = self._open.pop(name, None)
        if segment is None:
            while len(self._open) >= MAX_OPEN:  # a target that restarted made a new ring; the oldest are done
                self._open.pop(next(iter(self._open))).close()
            segment = shared_memory.SharedMemory(name=name)
            # attaching registers the segment with this process's resource tracker, which would unlink it at
            # exit (Python < 3.13 has no track=False): the target owns it
            resource_tracker.unregister(segment._name, "shared_memory")
        self._open[name] = segment  # most recent last
        return segment

    def close(self) -> None:
        for segment in self._open.values():
            try:
                segment.close()
            except BufferError:
                pass
        self._open.clear()
