"""Service lifecycle: serve() until cancelled with health on the way up and down; start-up errors."""

from __future__ import annotations

import asyncio

import pytest

from functools import partial

from services import model_main

start = partial(model_main.start, role="target")
serve = partial(model_main.serve, role="target")
from shared.engine.errors import ModelLoadError
from shared.rpc.server import TARGET_SERVICE
from tests.support.model_services import free_port, health_status, model_settings


def test_serve_reports_ready_then_stops_gracefully_on_cancel(tiny_model_dir):
    port = free_port()
    address = f"127.0.0.1:{port}"

    async def main():
        ready = asyncio.Event()
        task = asyncio.create_task(serve(model_settings(tiny_model_dir, port=port), ready=ready))
        await asyncio.wait_for(ready.wait(), timeout=60)
        up = await health_status(address, TARGET_SERVICE)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return up, await health_status(address, TARGET_SERVICE)

    assert asyncio.run(main()) == ("SERVING", "UNAVAILABLE")


def test_start_fails_with_the_model_error_and_leaves_nothing_running(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        asyncio.run(start(model_settings(tmp_path / "missing")))


def test_address_and_idempotent_stop(tiny_model_dir):
    async def main():
        running = await start(model_settings(tiny_model_dir, host="0.0.0.0"))
        assert running.address == f"127.0.0.1:{running.port}" and running.port > 0
        assert await health_status(running.address) == "SERVING"
        await running.stop(0)
        await running.stop(0)
        return await health_status(running.address)

    assert asyncio.run(main()) == "UNAVAILABLE"
