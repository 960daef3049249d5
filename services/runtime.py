"""Lifecycle of a model service process: load, serve with health, stop gracefully.

    running = await start_model_service(settings, "target", register)   # tests, launcher: returns once SERVING
    running.address                                                      # "127.0.0.1:50052"
    await running.stop()

    await serve_until_stopped(start_model_service(...), ready=event)     # a process: until SIGTERM or cancel

Order in ``start_model_service``::

    tracing provider ─▶ load the engine (worker thread) ─▶ server + servicer + health SERVING ─▶ bind ─▶ start

Health goes SERVING only together with the servicer, so a launcher or a
compose healthcheck that sees SERVING can send work at once. ``stop`` first
flips health to NOT_SERVING (load balancers and the launcher stop sending),
then lets in-flight calls finish for ``shutdown_grace_s``, then frees the
engine thread and flushes the spans.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc.aio
from grpc_health.v1 import health

from services.settings import ServiceSettings
from shared.gc_freeze import freeze_after_startup
from shared.rpc.server import add_health, bind, create_server, set_serving
from shared.rpc.shared_secret import SecretServerInterceptor
from shared.rpc.tls import TlsConfigError
from shared.telemetry import TandemTracerProvider

if TYPE_CHECKING:  # the scheduler serves through this module too and never loads an engine (nor torch)
    from services.engine_host import EngineHost

log = logging.getLogger(__name__)

Register = Callable[["EngineHost", grpc.aio.Server], None]  # adds the role's servicer over the host to the server

# Addresses a server listens on that a client cannot dial; loopback reaches them.
_WILDCARD_HOSTS = {"0.0.0.0", "::", "[::]", ""}


@dataclass
class RunningService:
    """A serving model service."""

    role: str
    service: str  # fully qualified gRPC service name, as health checks spell it
    host: str
    port: int
    server: grpc.aio.Server
    health: health.aio.HealthServicer
    engine_host: EngineHost
    tracer_provider: TandemTracerProvider
    grace_s: float
    stopped: bool = False
    metrics_server: object | None = None  # the /metrics HTTP server (TANDEM_METRICS_PORT), if any
    relay_socket: object | None = None  # a draft's relay socket (services/draft/relay_socket.py), if it serves one

    @property
    def metrics_port(self) -> int | None:
        return None if self.metrics_server is None else self.metrics_server.server_port

    @property
    def address(self) -> str:
        """Where clients on this machine dial it (loopback when it listens on every interface)."""
        host = "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"{host}:{self.port}"

    async def stop(self, grace_s: float | None = None) -> None:
        """Idempotent: NOT_SERVING, drain in-flight calls for the grace period, free the engine thread, flush spans."""
        if self.stopped:
            return
        self.stopped = True
        await set_serving(self.health, [self.service], False)
        await self.server.stop(self.grace_s if grace_s is None else grace_s)
        if self.relay_socket is not None:  # after the grace, as gRPC's streams: what it did not answer is missed
            await self.relay_socket.close()
        self.engine_host.close()
        self.tracer_provider.shutdown()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()


async def start_model_service(settings: ServiceSettings, role: str, service: str, register: Register) -> RunningService:
    """Load the role's model and serve it; returns once health reports SERVING."""
    tls = settings.internal_server_tls()
    if tls is not None:
        tls.load()  # a bad certificate or key fails now, naming the file, before torch and the model load
    from services.engine_host import EngineHost

    provider = settings.tracing(role).setup()
    try:
        engine_host = await EngineHost.load(settings, role)
    except BaseException:
        provider.shutdown()
        raise
    secret = settings.secret()  # only the scheduler, which knows it, may drive this service
    server = create_server(tracer_provider=provider,  # spans only inside a request's trace: probes make none
                           interceptors=[SecretServerInterceptor(secret)] if secret else [], only_in_trace=True)
    engine_host.tracer_provider = provider  # step streams open one span per plan themselves (plan_spans.py)
    engine_host.settings = settings  # how the target dials a draft it pushes features to (feature_push.py)
    register(engine_host, server)
    health_servicer = await add_health(server, [service])
    metrics_server = _serve_metrics(settings, engine_host)
    relay_socket = None
    try:
        port = bind(server, settings.listen_address(role), tls=tls)
        await server.start()
        if getattr(engine_host, "relay_handler", None) is not None and settings.relay_socket:
            from services.draft.relay_socket import RelaySocketServer
            from shared.rpc.socket_tls import ServerSocketTls

            socket_tls = ServerSocketTls(tls) if tls is not None else None  # the same files, mutual where gRPC's is
            relay_socket = RelaySocketServer(engine_host.relay_handler, secret, socket_tls)
            engine_host.relay_port = await relay_socket.start(settings.host, settings.relay_socket_port)
    except BaseException:
        if relay_socket is not None:
            await relay_socket.close()
        engine_host.close()
        provider.shutdown()
        if metrics_server is not None:
            metrics_server.shutdown()
        raise
    running = RunningService(
        role=role,
        service=service,
        host=settings.host,
        port=port,
        server=server,
        health=health_servicer,
        engine_host=engine_host,
        tracer_provider=provider,
        grace_s=settings.shutdown_grace_s,
        metrics_server=metrics_server,
        relay_socket=relay_socket,
    )
    log.info("%s serving %s on %s%s", role, engine_host.describe(), running.address,
             "" if tls is None else " over mutual TLS" if tls.mutual else " over TLS")
    return running


def _serve_metrics(settings: ServiceSettings, engine_host):
    """The service's own /metrics (services/engine_metrics.py) on TANDEM_METRICS_PORT; None when unset."""
    if settings.metrics_port is None:
        return None
    from services.engine_metrics import EngineMetrics
    from shared.metrics import start_http_server

    engine_host.metrics = EngineMetrics(engine_host)
    server, _ = start_http_server(settings.metrics_port, engine_host.metrics.registry, addr=settings.host)
    return server


async def serve_until_stopped(starting: Awaitable[RunningService], *, ready: asyncio.Event | None = None,
                              freeze_gc: bool = False) -> None:  # fmt: skip
    """Await ``starting``, set ``ready``, serve until cancelled or SIGTERM/SIGINT, then stop gracefully.
    An unusable certificate or key ends the process with one line naming the file (exit status 1).
    ``freeze_gc`` (a process's own entry point): what startup made is frozen out of the collector's passes."""
    try:
        running = await starting
    except TlsConfigError as exc:
        raise SystemExit(f"cannot start: {exc}") from None
    if freeze_gc:
        freeze_after_startup()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping.set)
            handled.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    if ready is not None:
        ready.set()
    try:
        await stopping.wait()
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        log.info("%s stopping", running.role)
        await running.stop()
