"""Interceptors against a real grpc.aio server on loopback."""

from __future__ import annotations

import asyncio
import logging

import grpc
import grpc.aio
import pydantic
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import SpanKind, StatusCode

from shared.engine.errors import (
    ContextLengthError,
    DuplicateSequenceError,
    InvalidTreeError,
    OutOfBlocksError,
    UnknownSequenceError,
)
from shared.rpc.channel import aio_channel, sync_channel
from shared.rpc.server import add_health, bind, create_server
from shared.telemetry import setup_tracing


class _Cfg(pydantic.BaseModel):
    depth: int = pydantic.Field(ge=1)


def _raise(kind: str) -> None:
    match kind:
        case "unknown_seq":
            raise UnknownSequenceError("sequence 'r7' is not live")
        case "bad_tree":
            raise InvalidTreeError("node 3 has parent 5")
        case "too_long":
            raise ContextLengthError("4100 tokens > max_context 4096")
        case "no_blocks":
            raise OutOfBlocksError("need 4 blocks, 1 free")
        case "dup":
            raise DuplicateSequenceError("sequence 'r1' already live")
        case "pydantic":
            _Cfg(depth=0)
        case "value":
            raise ValueError("max_new_tokens must be >= 1")
        case "unimplemented":
            raise NotImplementedError("Reload is not supported")
        case "timeout":
            raise TimeoutError("draft did not answer")
        case "boom":
            raise RuntimeError("boom")


EXPECTED = {
    "unknown_seq": (grpc.StatusCode.NOT_FOUND, "sequence 'r7' is not live"),
    "bad_tree": (grpc.StatusCode.INVALID_ARGUMENT, "node 3 has parent 5"),
    "too_long": (grpc.StatusCode.OUT_OF_RANGE, "4100 tokens > max_context 4096"),
    "no_blocks": (grpc.StatusCode.RESOURCE_EXHAUSTED, "need 4 blocks, 1 free"),
    "dup": (grpc.StatusCode.ALREADY_EXISTS, "sequence 'r1' already live"),
    "pydantic": (grpc.StatusCode.INVALID_ARGUMENT, "depth: Input should be greater than or equal to 1"),
    "value": (grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens must be >= 1"),
    "unimplemented": (grpc.StatusCode.UNIMPLEMENTED, "Reload is not supported"),
    "timeout": (grpc.StatusCode.DEADLINE_EXCEEDED, "draft did not answer"),
    "boom": (grpc.StatusCode.INTERNAL, "RuntimeError: boom"),
}


class _Servicer:
    """Raw-bytes methods: the request names what to do."""

    def __init__(self, tracer_provider=None) -> None:
        self._tracer = tracer_provider.get_tracer("test") if tracer_provider else None

    async def unary(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        kind = request.decode()
        if kind == "abort":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not yours")
        if kind == "child_span" and self._tracer:
            with self._tracer.start_as_current_span("handler.work"):
                pass
        _raise(kind)
        return b"ok:" + request

    async def stream(self, request: bytes, context: grpc.aio.ServicerContext):
        kind = request.decode()
        for i in range(2):
            yield f"item{i}".encode()
            await asyncio.sleep(0)
        _raise(kind)
        yield b"last"

    async def stream_write(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        """Streaming handler written as a coroutine with context.write()."""
        await context.write(b"w0")
        _raise(request.decode())
        await context.write(b"w1")


def _generic_handler(servicer: _Servicer) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "test.Svc",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(servicer.unary),
            "Stream": grpc.unary_stream_rpc_method_handler(servicer.stream),
            "StreamWrite": grpc.unary_stream_rpc_method_handler(servicer.stream_write),
        },
    )


async def _start(tracer_provider=None, **tracing) -> tuple[grpc.aio.Server, str]:
    server = create_server(tracer_provider=tracer_provider, **tracing)
    server.add_generic_rpc_handlers((_generic_handler(_Servicer(tracer_provider)),))
    await add_health(server, ["test.Svc"])
    port = bind(server, "127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def _unary(channel: grpc.aio.Channel, kind: str) -> bytes:
    return await channel.unary_unary("/test.Svc/Unary")(kind.encode(), timeout=5)


async def _stream(channel: grpc.aio.Channel, method: str, kind: str) -> tuple[list[bytes], grpc.aio.AioRpcError | None]:
    items: list[bytes] = []
    try:
        async for item in channel.unary_stream(f"/test.Svc/{method}")(kind.encode(), timeout=5):
            items.append(item)
    except grpc.aio.AioRpcError as err:
        return items, err
    return items, None


def test_unary_errors_map_to_status_codes_and_server_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        server, address = await _start()
        try:
            async with aio_channel(address) as channel:
                assert await _unary(channel, "fine") == b"ok:fine"
                for kind, (code, message) in EXPECTED.items():
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await _unary(channel, kind)
                    assert info.value.code() == code, kind
                    assert message in info.value.details(), (kind, info.value.details())
                # context.abort() inside a handler passes through unchanged
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _unary(channel, "abort")
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert info.value.details() == "not yours"
                # still serving after every kind of failure
                assert await asyncio.gather(*(_unary(channel, f"again{i}") for i in range(5))) == [
                    f"ok:again{i}".encode() for i in range(5)
                ]
        finally:
            await server.stop(None)

    with caplog.at_level(logging.INFO, logger="shared.rpc.interceptors"):
        asyncio.run(main())
    internal = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(internal) == 1 and internal[0].exc_info is not None  # only INTERNAL logs a traceback
    assert "RuntimeError: boom" in internal[0].getMessage()


def test_streaming_errors_after_items() -> None:
    async def main() -> None:
        server, address = await _start()
        try:
            async with aio_channel(address) as channel:
                items, err = await _stream(channel, "Stream", "fine")
                assert items == [b"item0", b"item1", b"last"] and err is None
                items, err = await _stream(channel, "Stream", "unknown_seq")
                assert items == [b"item0", b"item1"]
                assert err is not None and err.code() == grpc.StatusCode.NOT_FOUND
                assert err.details() == "sequence 'r7' is not live"
                items, err = await _stream(channel, "Stream", "boom")
                assert items == [b"item0", b"item1"] and err.code() == grpc.StatusCode.INTERNAL
                # coroutine-style streaming (context.write)
                items, err = await _stream(channel, "StreamWrite", "fine")
                assert items == [b"w0", b"w1"] and err is None
                items, err = await _stream(channel, "StreamWrite", "no_blocks")
                assert items == [b"w0"] and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert await _unary(channel, "fine") == b"ok:fine"
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_trace_context_propagates_client_to_server() -> None:
    client_tp = setup_tracing("scheduler", exporter="memory")
    server_tp = setup_tracing("target", exporter="memory")
    client_tracer = client_tp.get_tracer("test.client")

    async def main() -> None:
        server, address = await _start(server_tp)
        try:
            async with aio_channel(address) as channel:
                with client_tracer.start_as_current_span("verify") as parent:
                    assert await _unary(channel, "child_span") == b"ok:child_span"
                    with pytest.raises(grpc.aio.AioRpcError):
                        await _unary(channel, "unknown_seq")
                    items, err = await _stream(channel, "Stream", "fine")
                    assert err is None and len(items) == 3
                # health checks are not traced
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service="test.Svc"), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            return parent
        finally:
            await server.stop(None)

    parent = asyncio.run(main())
    trace_id, parent_id = parent.get_span_context().trace_id, parent.get_span_context().span_id
    spans = server_tp.memory_exporter.get_finished_spans()
    by_name: dict[str, list] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert sorted(by_name) == ["handler.work", "test.Svc/Stream", "test.Svc/Unary"]

    for span in by_name["test.Svc/Unary"] + by_name["test.Svc/Stream"]:
        assert span.kind == SpanKind.SERVER
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == parent_id and span.parent.is_remote
        assert span.attributes["service.name"] == "target"  # copied onto the span for Phoenix
        assert span.resource.attributes["service.name"] == "target"
        assert span.attributes["rpc.system"] == "grpc" and span.attributes["rpc.service"] == "test.Svc"

    ok, failed = sorted(by_name["test.Svc/Unary"], key=lambda s: s.attributes["rpc.grpc.status_code"])
    assert ok.attributes["rpc.grpc.status_code"] == 0 and ok.status.status_code != StatusCode.ERROR
    assert failed.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]

    (child,) = by_name["handler.work"]
    assert child.context.trace_id == trace_id and child.parent.span_id == ok.context.span_id

    assert [s.name for s in client_tp.memory_exporter.get_finished_spans()] == ["verify"]


def test_internal_servers_trace_only_calls_inside_a_trace() -> None:
    """only_in_trace (the model services): a call with no trace context (a startup Info, a probe) makes no
    span, so it cannot become a root of its own; the same call inside a trace is traced as usual. And
    untraced_methods (the public endpoint's Info) are never traced."""
    client_tp = setup_tracing("scheduler", exporter="memory")
    internal_tp = setup_tracing("target", exporter="memory")
    public_tp = setup_tracing("public", exporter="memory")

    async def main() -> None:
        internal, internal_addr = await _start(internal_tp, only_in_trace=True)
        public, public_addr = await _start(public_tp, untraced_methods=("/grpc.health.v1.Health/", "/test.Svc/Unary"))
        try:
            async with aio_channel(internal_addr) as channel:
                assert await _unary(channel, "plain") == b"ok:plain"  # no context: no span
                with client_tracer.start_as_current_span("release"):
                    assert await _unary(channel, "traced") == b"ok:traced"
            async with aio_channel(public_addr) as channel:
                assert await _unary(channel, "probe") == b"ok:probe"
                items, err = await _stream(channel, "Stream", "fine")
                assert err is None and len(items) == 3
        finally:
            await internal.stop(None)
            await public.stop(None)

    client_tracer = client_tp.get_tracer("test.client")
    asyncio.run(main())
    (traced,) = internal_tp.memory_exporter.get_finished_spans()
    (release,) = client_tp.memory_exporter.get_finished_spans()
    assert traced.name == "test.Svc/Unary" and traced.parent.span_id == release.context.span_id
    assert [s.name for s in public_tp.memory_exporter.get_finished_spans()] == ["test.Svc/Stream"]


def test_sync_channel_injects_trace_context() -> None:
    client_tp = setup_tracing("sdk", exporter="memory")
    server_tp = setup_tracing("scheduler", exporter="memory")

    async def main() -> None:
        server, address = await _start(server_tp)
        try:

            def call() -> int:
                channel = sync_channel(address)
                try:
                    with client_tp.get_tracer("t").start_as_current_span("client") as span:
                        assert channel.unary_unary("/test.Svc/Unary")(b"x", timeout=5) == b"ok:x"
                        with pytest.raises(grpc.RpcError) as info:
                            channel.unary_unary("/test.Svc/Unary")(b"value", timeout=5)
                        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    return span.get_span_context().trace_id
                finally:
                    channel.close()

            return await asyncio.to_thread(call)
        finally:
            await server.stop(None)

    trace_id = asyncio.run(main())
    spans = server_tp.memory_exporter.get_finished_spans()
    assert len(spans) == 2 and {s.context.trace_id for s in spans} == {trace_id}


def test_health_probe_and_serving_switch() -> None:
    from shared.rpc.health_probe import check, main
    from shared.rpc.server import set_serving

    async def run() -> None:
        server = create_server()
        health = await add_health(server, ["test.Svc"])
        port = bind(server, "127.0.0.1:0")
        await server.start()
        address = f"127.0.0.1:{port}"
        try:
            assert await asyncio.to_thread(check, address, "test.Svc") == "SERVING"
            assert await asyncio.to_thread(main, [address]) == 0
            assert await asyncio.to_thread(check, address, "other.Svc") == "UNKNOWN_SERVICE"
            await set_serving(health, ["test.Svc"], False)
            assert await asyncio.to_thread(check, address, "test.Svc") == "NOT_SERVING"
            assert await asyncio.to_thread(main, [address, "test.Svc"]) == 1
        finally:
            await server.stop(None)
        assert await asyncio.to_thread(check, address, "", 0.5) == "UNREACHABLE"

    asyncio.run(run())
