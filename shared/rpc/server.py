"""grpc.aio servers with Tandem's interceptors and standard health checking.

server = create_server(tracer_provider=provider)
draft_pb2_grpc.add_DraftServiceServicer_to_server(servicer, server)
health = await add_health(server, [DRAFT_SERVICE])  # grpc.health.v1, SERVING
port = bind(server, "127.0.0.1:0")                  # tls=ServerTls(cert, key): TLS (shared/rpc/tls.py)
await server.start()
...
await set_serving(health, [DRAFT_SERVICE], False)  # e.g. while draining
await server.stop(grace=5)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider

import shared.rpc  # noqa: F401 - builds the generated code if needed
from shared.rpc.gen.tandem.v1 import draft_pb2, tandem_pb2, target_pb2
from shared.rpc.interceptors import HEALTH_METHOD_PREFIX, default_server_interceptors
from shared.rpc.tls import ServerTls

# Fully qualified service names, as health checks and reflection spell them.
DRAFT_SERVICE = draft_pb2.DESCRIPTOR.services_by_name["DraftService"].full_name  # tandem.v1.DraftService
TARGET_SERVICE = target_pb2.DESCRIPTOR.services_by_name["TargetService"].full_name  # tandem.v1.TargetService
TANDEM_SERVICE = tandem_pb2.DESCRIPTOR.services_by_name["Tandem"].full_name  # tandem.v1.Tandem
# Calls of the public endpoint that are probes, not requests: no trace of their own (health, `tandem status`).
PUBLIC_UNTRACED = (HEALTH_METHOD_PREFIX, f"/{TANDEM_SERVICE}/Info")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # trees with sparse distributions for a large batch fit easily

DEFAULT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a port in use is an error, not a silently shared listener
)


def public_options(max_prompt_bytes: int) -> tuple[tuple[str, int], ...]:
    """Options of the public endpoint: what a client may send is bounded by the largest prompt it may
    carry (text of ``max_prompt_bytes``, or token ids: up to 5 bytes each) plus 64 KiB of other fields,
    and at least 1 MiB; responses keep the internal bound."""
    receive = max(1 << 20, max_prompt_bytes + (64 << 10))
    return (("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.max_receive_message_length", receive),
            ("grpc.so_reuseport", 0))


def create_server(
    *,
    tracer_provider: TracerProvider | None = None,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    options: Sequence[tuple[str, int | str]] = DEFAULT_OPTIONS,
    untraced_methods: Sequence[str] = (HEALTH_METHOD_PREFIX,),
    only_in_trace: bool = False,
) -> grpc.aio.Server:
    """A grpc.aio server with error mapping and tracing first, then ``interceptors``.

    Tracing: no spans for ``untraced_methods`` (method-name prefixes); with ``only_in_trace`` none for calls
    that carry no trace context (shared.rpc.interceptors.TracingServerInterceptor)."""
    first = default_server_interceptors(tracer_provider, untraced_methods=untraced_methods, only_in_trace=only_in_trace)
    return grpc.aio.server(interceptors=[*first, *interceptors], options=list(options))


async def add_health(
    server: grpc.aio.Server, service_names: Iterable[str] = (), serving: bool = True
) -> health.aio.HealthServicer:
    """Register grpc.health.v1 on ``server``; "" (overall) and ``service_names`` start SERVING
    (or NOT_SERVING with ``serving=False``, e.g. until a model has loaded)."""
    servicer = health.aio.HealthServicer()
    await set_serving(servicer, service_names, serving)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


async def set_serving(servicer: health.aio.HealthServicer, service_names: Iterable[str], serving: bool) -> None:
    """Mark services (and the overall "" entry) SERVING or NOT_SERVING; watchers are notified."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *service_names):
        await servicer.set(name, status)


def bind(server: grpc.aio.Server, address: str = "127.0.0.1:0", *, tls: ServerTls | None = None) -> int:
    """Listen on ``address`` (TLS with ``tls``: its files are checked now and re-read when they change);
    returns the port."""
    port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port
