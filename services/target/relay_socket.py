"""The draft relay's socket, the target's side: what DraftRelay uses of a gRPC stream call, over a framed TCP socket.

    call = await RelaySocketCall.open("draft", 41234, secret)   # hello, then the draft's ack
    await call.write(handoff)                                   # a RelayHandoff frame
    async for trees in call: ...                                # RelayTrees frames, in order; ends when it closes
    call.cancel()

Where the draft serves one (its Info's ``relay_port``; services/draft/relay_socket.py), the relay uses it
instead of the gRPC ``Relay`` stream: the same messages, without gRPC's per-message cost
(shared/rpc/frame_socket.py). A connection that ends (the draft stopped, a malformed answer) ends the
iteration, which DraftRelay handles as a broken stream: what was out is missed and resynchronised.
"""

from __future__ import annotations

import asyncio
import logging
from ssl import SSLContext

from google.protobuf.message import DecodeError

from shared.rpc.frame_socket import MAGIC, FrameProtocol
from shared.rpc.gen.tandem.v1 import draft_pb2

log = logging.getLogger(__name__)
OPEN_S = 2.0  # connect and hello: longer than this and the relay goes over gRPC


def socket_host(address: str) -> str | None:
    """The host of a gRPC target address (``host:port``, ``[v6]:port``, ``dns:///host:port``); None for one a plain
    socket cannot dial (``unix:``, no port)."""
    if address.startswith("dns:"):
        address = address.split("/")[-1]
    elif address.startswith(("unix:", "unix-abstract:", "vsock:", "ipv4:", "ipv6:")):
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class RelaySocketCall:
    def __init__(self, proto: FrameProtocol) -> None:
        self._proto = proto
        self._cancelled = False

    @classmethod
    async def open(cls, host: str, port: int, secret: str | None = None, timeout_s: float = OPEN_S,
                   ssl: SSLContext | None = None, server_name: str | None = None) -> RelaySocketCall:  # fmt: skip
        """Connect (over TLS with ``ssl``, checking the draft's certificate for ``server_name`` or ``host``) and say
        hello; ConnectionError (or OSError, TimeoutError) when the draft does not answer it."""
        loop = asyncio.get_running_loop()
        tls = dict(ssl=ssl, server_hostname=server_name or host) if ssl is not None else {}
        transport, proto = await asyncio.wait_for(loop.create_connection(FrameProtocol, host, port, **tls), timeout_s)
        try:
            proto.send(MAGIC + (secret or "").encode())
            ack = await asyncio.wait_for(proto.frames.get(), timeout_s)
        except BaseException:
            transport.close()
            raise
        if ack != MAGIC:
            transport.close()
            raise ConnectionError(f"the draft's relay socket at {host}:{port} refused the hello")
        return cls(proto)

    async def write(self, msg: draft_pb2.RelayHandoff) -> None:
        await self._proto.write(msg.SerializeToString())

    def __aiter__(self) -> RelaySocketCall:
        return self

    async def __anext__(self) -> draft_pb2.RelayTrees:
        payload = await self._proto.frames.get()
        if payload is None:
            if not self._cancelled:
                log.warning("draft relay socket closed by the draft")
            raise StopAsyncIteration
        try:
            return draft_pb2.RelayTrees.FromString(payload)
        except DecodeError:
            log.warning("draft relay socket: a frame that is not a RelayTrees; the connection is closed")
            self.cancel()
            raise StopAsyncIteration from None

    def cancel(self) -> bool:
        self._cancelled = True
        self._proto.close()
        return True
