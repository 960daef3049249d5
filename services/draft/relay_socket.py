"""The draft relay's socket, the draft's side: the target's handoffs over a plain framed TCP connection.

    target ──hello (MAGIC + secret)──▶ draft ──ack (MAGIC)──▶ target
    target ──RelayHandoff frame──▶ DraftServiceServicer.Relay ──RelayTrees frame──▶ target   (one each per step)

The same handler as the gRPC ``Relay`` stream runs each connection (relay_stream.py): one engine call and
one answer per handoff, in order. Only the transport differs (shared/rpc/frame_socket.py says why). The
port is any free one unless ``relay_socket_port`` names one; Info reports it (``relay_port``), and a
target finds it there. With internal TLS the socket speaks it too, from the same files, mutual where
gRPC's is (shared/rpc/socket_tls.py). A peer whose hello lacks the internal secret is closed, having
changed nothing.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from google.protobuf.message import DecodeError

from shared.rpc.frame_socket import MAGIC, FrameProtocol
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.socket_tls import ServerSocketTls

log = logging.getLogger(__name__)
HELLO_S = 5.0  # a connection that says nothing for this long is closed

Relay = Callable[[AsyncIterator[draft_pb2.RelayHandoff], object], Awaitable[None]]


class _Writer:
    """What the Relay handler writes its answers to (a gRPC servicer context's ``write``)."""

    def __init__(self, proto: FrameProtocol) -> None:
        self._proto = proto

    async def write(self, msg: draft_pb2.RelayTrees) -> None:
        await self._proto.write(msg.SerializeToString())


async def _handoffs(proto: FrameProtocol) -> AsyncIterator[draft_pb2.RelayHandoff]:
    while (payload := await proto.frames.get()) is not None:
        try:
            yield draft_pb2.RelayHandoff.FromString(payload)
        except DecodeError:
            log.warning("relay socket: a frame that is not a RelayHandoff; the connection is closed")
            proto.close()
            return


class RelaySocketServer:
    def __init__(self, relay: Relay, secret: str | None = None, tls: ServerSocketTls | None = None) -> None:
        self._relay = relay
        self._tls = tls
        self._secret = (secret or "").encode()
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.Task] = set()
        self.port = 0
        self.num_refused = 0  # connections closed for a wrong hello

    async def start(self, host: str, port: int = 0) -> int:
        """Listen on ``host``:``port`` (0: any free port); the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, host or None, port,
                                                ssl=self._tls.context if self._tls is not None else None)  # fmt: skip
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def _protocol(self) -> FrameProtocol:
        if self._tls is not None:  # before this connection's handshake: certificate files that changed load now
            self._tls.refresh()
        proto = FrameProtocol()
        task = asyncio.get_running_loop().create_task(self._serve(proto), name="relay-socket")
        self._conns.add(task)
        task.add_done_callback(self._conns.discard)
        return proto

    async def _serve(self, proto: FrameProtocol) -> None:
        try:
            hello = await asyncio.wait_for(proto.frames.get(), HELLO_S)
        except asyncio.TimeoutError:
            hello = None
        if hello is None or not hello.startswith(MAGIC) or not hmac.compare_digest(hello[len(MAGIC):], self._secret):
            if hello is not None:
                self.num_refused += 1
                log.warning("relay socket: a connection without the internal secret was closed")
            proto.close()
            return
        try:
            proto.send(MAGIC)
            await self._relay(_handoffs(proto), _Writer(proto))
        except ConnectionError:
            pass  # the target went away: what it handed off and was not answered is missed on its side
        finally:
            proto.close()

    async def close(self) -> None:
        """Stop listening and close every connection (their handoffs not answered are missed by the target)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        if self._conns:
            await asyncio.gather(*self._conns, return_exceptions=True)
