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

from shared.rpc.call_details import Rewrite, UnaryUnaryRewriter, rewriting_interceptors
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


class MetadataGate(grpc.aio.ServerInterceptor):
    """Lets a call through when ``refusal`` (of its metadata) is None; else UNAUTHENTICATED with that reason.
    grpc.health.v1 is always let through."""

    def __init__(self) -> None:
        self.num_denied = 0

    def refusal(self, metadata: dict[str, str | bytes]) -> str | None:
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method.startswith(OPEN_PREFIXES):
            return await continuation(details)
        reason = self.refusal(dict(details.invocation_metadata or ()))
        if reason is None:
            return await continuation(details)
        self.num_denied += 1
        log.warning("%s denied: %s", details.method, reason.split(";")[0])  # the reason, never a value
        handler = await continuation(details)
        return None if handler is None else deny_like(handler, reason)


class SecretServerInterceptor(MetadataGate):
    def __init__(self, secret: str) -> None:
        super().__init__()
        self._secret = secret.encode()

    def refusal(self, metadata: dict[str, str | bytes]) -> str | None:
        sent = metadata.get(METADATA_KEY)
        sent_bytes = sent.encode() if isinstance(sent, str) else (sent or b"")
        if sent is not None and hmac.compare_digest(sent_bytes, self._secret):
            return None
        what = "missing" if sent is None else "wrong"
        return f"{what} internal secret ({METADATA_KEY}); only the scheduler may call this"


def deny_like(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind (so deserialisation and streaming match) that aborts."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def stream(request: Any, context: grpc.aio.ServicerContext):  # noqa: ANN202 - async generator
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - never reached

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    return grpc.unary_unary_rpc_method_handler(unary, **kw)


def _adding_secret(secret: str) -> Rewrite:
    pair = (METADATA_KEY, secret)

    def rewrite(d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()), pair)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)

    return rewrite


class SecretClientInterceptor(UnaryUnaryRewriter):
    """The secret on unary calls only (see call_details.py); ``secret_client_interceptors`` covers every kind."""

    def __init__(self, secret: str) -> None:
        super().__init__(_adding_secret(secret))


def secret_client_interceptors(secret: str) -> list[grpc.aio.ClientInterceptor]:
    """The secret on every call a channel makes: unary, server-streaming, client-streaming (the target's
    feature push) and bidirectional (the step streams)."""
    return rewriting_interceptors(_adding_secret(secret))
