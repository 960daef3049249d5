"""A shared secret between the scheduler and the model services (TANDEM_INTERNAL_SECRET).

    scheduler ──[x-tandem-secret: S]──▶ target / draft      (SecretClientInterceptor adds it)
                                         SecretServerInterceptor: missing or wrong ─▶ UNAUTHENTICATED

Only the scheduler may drive a model service: a stray client that reaches the port (the
services listen on loopback by default, on compose's internal network in containers) gets
UNAUTHENTICATED and changes nothing. grpc.health.v1 stays open, for orchestrators' probes.
The secret is compared in constant time and never logged; with no secret configured both
interceptors are absent (the default on a single machine's loopback).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

log = logging.getLogger(__name__)

METADATA_KEY = "x-tandem-secret"
OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def load_secret(value: str | None, path: Path | str | None = None) -> str | None:
    """The secret from a value or a file (its first line); None when neither is set. Empty is an error."""
    if path:
        value = Path(path).read_text(encoding="utf-8").splitlines()[0] if Path(path).stat().st_size else ""
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise ValueError("the internal secret is set but empty")
    return value


class SecretServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, secret: str) -> None:
        self._secret = secret.encode()
        self.num_denied = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method.startswith(OPEN_PREFIXES):
            return await continuation(details)
        sent = next((v for k, v in (details.invocation_metadata or ()) if k == METADATA_KEY), None)
        sent_bytes = sent.encode() if isinstance(sent, str) else (sent or b"")
        if sent is not None and hmac.compare_digest(sent_bytes, self._secret):
            return await continuation(details)
        self.num_denied += 1
        reason = "missing" if sent is None else "wrong"
        log.warning("%s denied: %s internal secret", details.method, reason)  # never the value
        handler = await continuation(details)
        if handler is None:
            return None
        return deny_like(handler, f"{reason} internal secret ({METADATA_KEY}); only the scheduler may call this")


def deny_like(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind (so deserialisation and streaming match) that aborts."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext):  # noqa: ANN202 - async generator
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - never reached

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    return grpc.unary_unary_rpc_method_handler(unary, **kw)


class SecretClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    def __init__(self, secret: str) -> None:
        self._pair = (METADATA_KEY, secret)

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()), self._pair)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._details(client_call_details), request)
