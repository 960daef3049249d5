"""The model service processes (target and draft): one entry point, the role picks the servicer.

    running = await start(ServiceSettings(model="/models/x", port=0), "target")   # returns once SERVING
    await serve(ServiceSettings.from_env(), "draft")                             # until SIGTERM (`tandem serve draft`)
    python -m services.model_main target|draft                                   # the same, configured by TANDEM_*
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import TYPE_CHECKING, Literal

import grpc.aio

from services.runtime import RunningService, serve_until_stopped, start_model_service
from services.settings import ServiceSettings
from shared.rpc.server import DRAFT_SERVICE, TARGET_SERVICE
from shared.event_loop import run_loop

if TYPE_CHECKING:  # torch loads with the engine, after the settings and certificates are checked
    from services.engine_host import EngineHost

ModelRole = Literal["target", "draft"]
ROLES: tuple[ModelRole, ...] = ("target", "draft")


def _register(role: ModelRole):
    def register(host: EngineHost, server: grpc.aio.Server) -> None:
        if role == "target":
            from services.target.servicer import TargetServiceServicer
            from shared.rpc.gen.tandem.v1 import target_pb2_grpc

            target_pb2_grpc.add_TargetServiceServicer_to_server(TargetServiceServicer(host), server)
        else:
            from services.draft.servicer import DraftServiceServicer
            from shared.rpc.gen.tandem.v1 import draft_pb2_grpc

            draft_pb2_grpc.add_DraftServiceServicer_to_server(DraftServiceServicer(host), server)

    return register


async def start(settings: ServiceSettings, role: ModelRole) -> RunningService:
    """Load the role's model and serve it; returns once health reports SERVING."""
    if role not in ROLES:
        raise ValueError(f"unknown model service role {role!r}; use one of {ROLES}")
    service = TARGET_SERVICE if role == "target" else DRAFT_SERVICE
    return await start_model_service(settings, role, service, _register(role))


async def serve(settings: ServiceSettings, role: ModelRole, *, ready: asyncio.Event | None = None,
                freeze_gc: bool = False) -> None:  # fmt: skip
    """Serve until cancelled or SIGTERM/SIGINT; ``ready`` is set once SERVING; ``freeze_gc``: the process's own
    entry point (shared/gc_freeze.py)."""
    await serve_until_stopped(start(settings, role), ready=ready, freeze_gc=freeze_gc)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ROLES:
        raise SystemExit(f"usage: python -m services.model_main {'|'.join(ROLES)}")
    settings = ServiceSettings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_loop(serve(settings, args[0], freeze_gc=True))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
