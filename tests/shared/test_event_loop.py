"""TANDEM_EVENT_LOOP: the services' event loop (shared/event_loop.py)."""

from __future__ import annotations

import asyncio

import pytest

from shared.event_loop import loop_choice, loop_factory, run_loop


def test_uvloop_by_default_and_asyncio_on_request():
    import uvloop

    assert loop_choice({}) == "uvloop" and loop_factory({}) is uvloop.new_event_loop
    assert loop_choice({"TANDEM_EVENT_LOOP": "asyncio"}) == "asyncio" and loop_factory({"TANDEM_EVENT_LOOP": "asyncio"}) is None


def test_an_unknown_loop_is_an_error_naming_the_variable():
    with pytest.raises(ValueError, match="TANDEM_EVENT_LOOP"):
        loop_choice({"TANDEM_EVENT_LOOP": "trio"})


def test_run_loop_runs_a_grpc_aio_round_trip_on_the_chosen_loop():
    import grpc
    import grpc.aio

    async def main() -> tuple[str, bytes]:
        server = grpc.aio.server()
        same = lambda b: b  # noqa: E731

        async def echo(request, ctx):
            return request

        handler = grpc.method_handlers_generic_handler(
            "t.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo, same, same)})  # fmt: skip
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await channel.unary_unary("/t.Echo/Call", request_serializer=same, response_deserializer=same)(b"hi")
        finally:
            await server.stop(0)
        return type(asyncio.get_running_loop()).__module__, reply

    module, reply = run_loop(main())
    assert module.startswith("uvloop") and reply == b"hi"


def test_a_bad_loop_setting_exits_with_its_message(monkeypatch):
    async def never() -> None:
        raise AssertionError("must not run")

    monkeypatch.setenv("TANDEM_EVENT_LOOP", "trio")
    with pytest.raises(SystemExit, match="TANDEM_EVENT_LOOP must be one of"):
        run_loop(never())
