"""A scheduler whose start-up fails after its loop task exists stops cleanly and raises, instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from services.settings import ServiceSettings
from shared.state.redis_server import start_redis
from tests.support.model_services import serving


def test_a_port_in_use_fails_the_start_instead_of_hanging(tiny_model_dir):
    """Its public port is the target's own: bind fails right after the loop task is created."""
    from services.scheduler.main import start

    async def main():
        async with serving(tiny_model_dir) as (target, _):
            settings = ServiceSettings(
                model=str(tiny_model_dir),
                target_addr=target.address,
                draft_addr="none",
                redis_url=redis.url,
                port=target.port,
                trace_exporter="memory",
                metrics_port=None,
            )
            with pytest.raises(RuntimeError, match="bind"):
                await asyncio.wait_for(start(settings), timeout=30)

    with start_redis() as redis:
        asyncio.run(main())
