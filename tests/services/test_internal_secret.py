"""The internal shared secret: a model service refuses callers without it (UNAUTHENTICATED, nothing
changed, the secret never logged), health stays open, and the scheduler that knows it is served."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from services.scheduler.grpc_workers import GrpcTargetWorker
from shared.engine.types import PrefillItem, SamplingParams
from shared.rpc.health_probe import check
from shared.rpc.shared_secret import SecretClientInterceptor, load_secret, secret_client_interceptors
from shared.rpc.server import TARGET_SERVICE
from tests.support.model_services import serving

SECRET = "correct horse battery staple"


def test_model_service_answers_only_the_holder_of_the_secret(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)

    async def main() -> None:
        async with serving(tiny_model_dir, internal_secret=SECRET) as (target, _):
            assert await asyncio.to_thread(check, target.address, TARGET_SERVICE, 2.0) == "SERVING"
            item = PrefillItem("s1", [1, 2, 3], SamplingParams())
            for interceptors in ([], [SecretClientInterceptor("wrong")]):
                stranger = GrpcTargetWorker(target.address, interceptors=interceptors)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stranger.prefill([item])
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "internal secret" in info.value.details()
                await stranger.close()
            scheduler = GrpcTargetWorker(target.address, interceptors=[SecretClientInterceptor(SECRET)])
            [result] = await scheduler.prefill([item])  # s1 was not created by the refused calls
            assert result.seq_id == "s1"
            assert (await scheduler.info()).num_live_seqs == 1
            await scheduler.close()

    asyncio.run(main())
    assert SECRET not in caplog.text and "wrong" not in caplog.text.replace("wrong internal secret", "")


def test_secret_from_a_file_and_empty_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert load_secret(None, path) == "from-file"
    assert load_secret(None) is None
    with pytest.raises(ValueError):
        load_secret("  ")


def test_step_streams_carry_the_secret(tiny_model_dir):
    """The bidirectional step stream gets the secret like a unary call (a launched stack with
    TANDEM_WORKER_PROTOCOL=stream was refused at its first prefill before); a stranger's stream is refused."""
    from services.scheduler.stream_workers import StreamTargetWorker

    async def main() -> None:
        async with serving(tiny_model_dir, internal_secret=SECRET) as (target, _):
            item = PrefillItem("s1", [1, 2, 3], SamplingParams())
            stranger = StreamTargetWorker(target.address)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stranger.prefill([item])
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            await stranger.close()
            scheduler = StreamTargetWorker(target.address, interceptors=secret_client_interceptors(SECRET))
            [result] = await scheduler.prefill([item])
            assert result.seq_id == "s1" and 0 <= result.first_token
            [again] = await scheduler.prefill([PrefillItem("s2", [4, 5], SamplingParams())])  # the same stream
            assert again.seq_id == "s2" and scheduler.stream.num_opened == 1
            # on a channel of its own, without interceptors (each costs a task switch per message)
            assert scheduler._bare_channel is not None and scheduler._bare_channel is not scheduler.channel
            await scheduler.close()

    asyncio.run(main())


def test_the_secret_rides_on_every_call_kind():
    """grpc.aio files an interceptor under the first call kind it implements only: the secret needs one
    interceptor per kind, or streamed calls (step streams, the target's feature push) go without it."""
    from shared.rpc.channel import aio_channel

    async def main() -> None:
        def sent(ctx) -> bytes:
            return dict(ctx.invocation_metadata()).get("x-tandem-secret", "none").encode()

        async def unary(request, ctx):
            return sent(ctx)

        async def server_stream(request, ctx):
            yield sent(ctx)

        async def client_stream(requests, ctx):
            async for _ in requests:
                pass
            return sent(ctx)

        async def bidi(requests, ctx):
            async for _ in requests:
                yield sent(ctx)

        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("t.T", {
            "U": grpc.unary_unary_rpc_method_handler(unary), "SS": grpc.unary_stream_rpc_method_handler(server_stream),
            "CS": grpc.stream_unary_rpc_method_handler(client_stream), "B": grpc.stream_stream_rpc_method_handler(bidi),
        })])  # fmt: skip
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = aio_channel(f"127.0.0.1:{port}", interceptors=secret_client_interceptors(SECRET))
        try:
            assert await channel.unary_unary("/t.T/U")(b"x") == SECRET.encode()
            assert [m async for m in channel.unary_stream("/t.T/SS")(b"x")] == [SECRET.encode()]
            call = channel.stream_unary("/t.T/CS")()
            await call.write(b"x")
            await call.done_writing()
            assert await call == SECRET.encode()
            call = channel.stream_stream("/t.T/B")()
            await call.write(b"x")
            assert await call.read() == SECRET.encode()
            call.cancel()
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(main())
