"""The target service process.

running = await start(ServiceSettings(model="/models/x", port=0))   # returns once SERVING
await serve(ServiceSettings.from_env())                            # `tandem serve target`, until SIGTERM
python -m services.target.main                                     # the same, configured by TANDEM_*
"""

from __future__ import annotations

import asyncio
import logging

import grpc.aio

from services.engine_host import EngineHost
from services.runtime import RunningService, serve_until_stopped, start_model_service
from services.settings import ServiceSettings
from services.target.servicer import TargetServiceServicer
from shared.rpc.gen.tandem.v1 import target_pb2_grpc
from shared.rpc.server import TARGET_SERVICE


def _register(host: EngineHost, server: grpc.aio.Server) -> None:
    target_pb2_grpc.add_TargetServiceServicer_to_server(TargetServiceServicer(host), server)


async def start(settings: ServiceSettings) -> RunningService:
    """Load the target model and serve it; returns once health reports SERVING."""
    return await start_model_service(settings, "target", TARGET_SERVICE, _register)


async def serve(settings: ServiceSettings, *, ready: asyncio.Event | None = None) -> None:
    """Serve until cancelled or SIGTERM/SIGINT; ``ready`` is set once SERVING."""
    await serve_until_stopped(start(settings), ready=ready)


if __name__ == "__main__":
    settings = ServiceSettings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(settings))
