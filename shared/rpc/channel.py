"""Client channels that carry trace context (sync for the SDK, aio for the scheduler).

channel = aio_channel("127.0.0.1:50052")
stub = target_pb2_grpc.TargetServiceStub(channel)
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import grpc.aio

from shared.rpc.interceptors import SyncTracingClientInterceptor, tracing_client_interceptors
from shared.rpc.server import DEFAULT_OPTIONS

CLIENT_OPTIONS: tuple[tuple[str, int], ...] = (
    *(o for o in DEFAULT_OPTIONS if o[0] != "grpc.so_reuseport"),
    # A peer that comes back (a restarted draft service) is picked up within a second or two,
    # not after gRPC's default reconnect backoff of up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def aio_channel(
    target: str,
    *,
    tracing: bool = True,
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    options: Sequence[tuple[str, int | str]] = CLIENT_OPTIONS,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel (TLS with ``credentials``); with ``tracing`` the current trace context rides along."""
    chain = [*tracing_client_interceptors(), *interceptors] if tracing else list(interceptors)
    if credentials is not None:
        return grpc.aio.secure_channel(target, credentials, options=list(options), interceptors=chain or None)
    return grpc.aio.insecure_channel(target, options=list(options), interceptors=chain or None)


def sync_channel(
    target: str,
    *,
    tracing: bool = True,
    options: Sequence[tuple[str, int | str]] = CLIENT_OPTIONS,
    credentials: grpc.ChannelCredentials | None = None,
) -> grpc.Channel:
    """A blocking channel (TLS with ``credentials``); with ``tracing`` the current trace context rides along."""
    if credentials is not None:
        channel = grpc.secure_channel(target, credentials, options=list(options))
    else:
        channel = grpc.insecure_channel(target, options=list(options))
    return grpc.intercept_channel(channel, SyncTracingClientInterceptor()) if tracing else channel
