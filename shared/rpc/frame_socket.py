"""Length-prefixed frames over one plain TCP connection: the draft relay's socket (docs/services.md, "Relay socket").

    frame  = uint32 little-endian length | payload (a serialized protobuf message)
    hello  = MAGIC + the internal secret (target -> draft, first frame)     ack = MAGIC (draft -> target)

A gRPC stream message costs each side a completion through gRPC's poller thread and back into the event
loop, HTTP/2 framing and a future per write: on a 2-core host a loopback ping-pong of one long-lived
call takes 0.2 ms, against 0.085 ms for the same bytes on a uvloop socket (bench/grpc_floor.py; the
socket figure in docs/services.md). The relay trades two messages per speculative step, so it gets
this channel; everything else stays on gRPC.

``FrameProtocol`` is the asyncio protocol both ends use: frames in go to ``frames`` (an asyncio.Queue;
None once the connection is gone), frames out through ``write``, which waits only while the kernel's
buffer is full. A frame over ``MAX_FRAME`` bytes, or a length that cannot be one, closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket

log = logging.getLogger(__name__)

MAGIC = b"tandem-relay/1\n"
MAX_FRAME = 64 << 20  # bytes: far above any relay message (a batch of trees), far below memory trouble
_HEADER = 4


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    return len(payload).to_bytes(_HEADER, "little") + payload


class FrameProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.frames: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._buf = bytearray()  # bytes of a frame not complete yet
        self._paused: asyncio.Future | None = None  # set while the transport's write buffer is over its high mark
        self.lost = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # a frame leaves as it is written

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        if not buf and len(data) >= _HEADER and int.from_bytes(data[:_HEADER], "little") == len(data) - _HEADER:
            self.frames.put_nowait(data[_HEADER:])  # the usual case: exactly one whole frame, no copy into buf
            return
        buf += data
        while len(buf) >= _HEADER:
            n = int.from_bytes(buf[:_HEADER], "little")
            if n > MAX_FRAME:
                log.warning("frame socket: a %d-byte frame is over the %d-byte limit; the connection is closed",
                            n, MAX_FRAME)  # fmt: skip
                buf.clear()
                self.transport.close()
                return
            if len(buf) < _HEADER + n:
                return
            self.frames.put_nowait(bytes(buf[_HEADER : _HEADER + n]))
            del buf[: _HEADER + n]

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.frames.put_nowait(None)
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    def pause_writing(self) -> None:
        self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        self._paused = None

    def send(self, payload: bytes) -> None:
        """Queue one frame on the transport (written at once when the socket takes it); ConnectionError when the
        connection is gone."""
        if self.lost or self.transport is None or self.transport.is_closing():
            raise ConnectionError("the frame socket is closed")
        self.transport.write(frame(payload))

    async def write(self, payload: bytes) -> None:
        """``send``, then wait while the write buffer is over its high mark (the peer reads slower than we write)."""
        self.send(payload)
        if self._paused is not None:
            await self._paused
            if self.lost:
                raise ConnectionError("the frame socket closed while a write waited")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
