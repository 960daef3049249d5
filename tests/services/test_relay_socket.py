"""The draft relay's socket (services/draft/relay_socket.py, services/target/relay_socket.py): the target finds it in
the draft's Info and relays over it, with the same output as over gRPC; gRPC stays where the socket is off or
refused; a stranger without the internal secret, or a malformed frame, is closed and changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from services.scheduler.stream_workers import StreamDraftWorker, StreamTargetWorker
from services.target.relay_socket import RelaySocketCall, socket_host
from shared.engine.types import RELAY_TAKE, PrefillItem, SpecItem, VerifyItem
from shared.rpc.frame_socket import MAGIC, MAX_FRAME, FrameProtocol, frame
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.shared_secret import secret_client_interceptors
from tests.support.model_services import greedy_reference, serving

PROMPT = [3, 14, 15, 92, 65, 35]
SECRET = "relay socket secret"


class _Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name):
        return None

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_frames_split_and_joined_arrive_whole_and_an_oversized_one_closes():
    async def main():
        proto = FrameProtocol()
        proto.connection_made(_Transport())
        stream = frame(b"one") + frame(b"") + frame(b"three")
        for i in range(0, len(stream), 2):  # two bytes at a time
            proto.data_received(stream[i : i + 2])
        proto.data_received(frame(b"four") + frame(b"five"))  # two in one read
        proto.data_received(frame(b"six"))  # one whole frame: the no-copy path
        got = [proto.frames.get_nowait() for _ in range(proto.frames.qsize())]
        assert got == [b"one", b"", b"three", b"four", b"five", b"six"]
        proto.send(b"out")
        assert proto.transport.written == [frame(b"out")]
        proto.data_received((MAX_FRAME + 1).to_bytes(4, "little"))
        assert proto.transport.closed and proto.frames.empty()
        proto.connection_lost(None)
        assert await proto.frames.get() is None
        with pytest.raises(ConnectionError):
            proto.send(b"late")

    asyncio.run(main())


def test_socket_host_of_grpc_addresses():
    assert socket_host("draft:50053") == "draft"
    assert socket_host("127.0.0.1:41234") == "127.0.0.1"
    assert socket_host("[::1]:50053") == "::1"
    assert socket_host("dns:///draft.tandem.svc:50053") == "draft.tandem.svc"
    assert socket_host("unix:/tmp/draft.sock") is None
    assert socket_host("draft") is None


async def _relay_greedy(target, draft, steps: int = 20, seq: str = "a", **dial) -> list[int]:
    """Greedy steps of one sequence with the target relaying to the draft, from scheduler workers dialled with ``dial``."""
    tw, dw = StreamTargetWorker(target.address, **dial), StreamDraftWorker(draft.address, **dial)
    tw.relay_to = draft.address
    try:
        return await _steps(tw, dw, steps, seq)
    finally:
        await tw.close()
        await dw.close()


async def _steps(tw, dw, steps: int, seq: str) -> list[int]:
    first = (await tw.prefill([PrefillItem(seq, PROMPT)]))[0].first_token
    await dw.prefill([PrefillItem(seq, PROMPT)])
    out = [first]
    tree = (await dw.speculate([SpecItem(seq, [first], chain_len=3)]))[0]
    res = (await tw.verify([VerifyItem(seq, tree, handoff=SpecItem(seq, [], chain_len=3), remaining=60)]))[0]
    out += res.tokens
    while len(out) < steps:
        item = VerifyItem(seq, relay=RELAY_TAKE, handoff=SpecItem(seq, [], chain_len=3), remaining=60 - len(out))
        res = (await tw.verify([item]))[0]
        assert not res.relay_missed and res.relay_tree is not None
        out += res.tokens
    return out


@pytest.mark.parametrize(
    ("overrides", "transport"),
    [
        ({}, "socket"),
        ({"internal_secret": SECRET}, "socket"),  # the hello carries the secret
        ({"relay_transport": "grpc"}, "grpc"),
        ({"relay_socket": False}, "grpc"),  # the draft serves none: Info says port 0
    ],
)
def test_the_relay_runs_over_the_socket_where_the_draft_serves_one(tiny_model_dir, overrides, transport):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir, **overrides) as (target, draft):
            assert bool(draft.engine_host.info().relay_port) == (overrides.get("relay_socket", True))
            secret = overrides.get("internal_secret")
            interceptors = secret_client_interceptors(secret) if secret else []
            out = await _relay_greedy(target, draft, interceptors=interceptors)
            return out, target.engine_host.draft_relay.transport

    out, used = asyncio.run(main())
    assert used == transport
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))


def test_a_stranger_or_a_malformed_frame_is_closed_and_the_relay_goes_on(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir, internal_secret=SECRET) as (target, draft):
            port = draft.engine_host.info().relay_port
            with pytest.raises(ConnectionError):  # no secret, then a wrong one: closed without an ack
                await RelaySocketCall.open("127.0.0.1", port)
            with pytest.raises(ConnectionError):
                await RelaySocketCall.open("127.0.0.1", port, "wrong")
            assert draft.relay_socket.num_refused == 2
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the secret, then garbage
            writer.write(frame(MAGIC + SECRET.encode()))
            assert await reader.readexactly(4 + len(MAGIC)) == frame(MAGIC)
            writer.write(frame(b"\xff\xff\xff not a handoff"))
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the draft
            writer.close()
            out = await _relay_greedy(target, draft, steps=12, interceptors=secret_client_interceptors(SECRET))
            return out, draft.engine_host.info().num_live_seqs

    out, live = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))
    assert live == 1  # only the sequence the scheduler prefilled: the strangers made none


def test_under_internal_mutual_tls_the_socket_speaks_it_and_a_client_without_a_certificate_is_refused(
        tiny_model_dir, tmp_path):  # fmt: skip
    import ssl

    from shared.rpc.socket_tls import client_context
    from shared.rpc.tls import ClientTls
    from tests.support.certs import TestCA

    ca = TestCA()
    roots = ca.write(tmp_path / "ca.crt")
    cert, key = ca.issue(tmp_path / "internal")
    tls = {"internal_tls_cert": cert, "internal_tls_key": key, "internal_tls_ca": roots}
    client = ClientTls(ca=roots, cert=cert, key=key)

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir, **tls) as (target, draft):
            port = draft.engine_host.info().relay_port
            with pytest.raises((OSError, ConnectionError)):  # plaintext to a TLS socket: no ack
                await RelaySocketCall.open("127.0.0.1", port, timeout_s=1.0)
            with pytest.raises((OSError, ConnectionError, ssl.SSLError)):  # TLS without a client certificate
                call = await RelaySocketCall.open("127.0.0.1", port, ssl=client_context(ClientTls(ca=roots)),
                                                  timeout_s=1.0)  # fmt: skip
                await call.write(draft_pb2.RelayHandoff(step=1))
                await asyncio.wait_for(call.__anext__(), 1.0)  # the server's refusal arrives after the handshake
            out = await _relay_greedy(target, draft, steps=12, credentials=client.credentials())
            return out, target.engine_host.draft_relay.transport

    out, used = asyncio.run(main())
    assert used == "socket"
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))


def test_a_restarted_draft_is_found_again_on_its_new_socket(tiny_model_dir, monkeypatch):
    """The draft restarts on its gRPC port, its relay socket on another free one: the target's next handoff after the
    broken stream's pause asks Info again and relays over the new socket; the output stays the target's."""
    import services.target.draft_relay as draft_relay
    from services.model_main import start
    from tests.support.model_services import model_settings

    monkeypatch.setattr(draft_relay, "RETRY_S", 0.2)  # the pause after a broken relay stream

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (target, draft):
            before = draft.engine_host.info().relay_port
            out = await _relay_greedy(target, draft, steps=8)
            await draft.stop(0)
            again = await start(model_settings(tiny_model_dir, port=draft.port), "draft")
            try:
                await asyncio.sleep(0.3)
                after = again.engine_host.info().relay_port
                return out, await _relay_greedy(target, again, steps=8, seq="b"), before, after, target
            finally:
                await again.stop(0)

    out, again, before, after, target = asyncio.run(main())
    assert before != after and target.engine_host.draft_relay.transport == "socket"
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))
    assert again == greedy_reference(tiny_model_dir, tuple(PROMPT), len(again))
