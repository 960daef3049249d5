"""grpc.aio client interceptors that rewrite each call's details (metadata: trace context, the internal secret).

    interceptors = rewriting_interceptors(lambda details: details_with_more_metadata)   # one per call kind

A grpc.aio channel files an interceptor under the first call kind it implements only (an ``elif`` chain in
grpc/aio/_channel.py), so one class implementing all four would be called for unary calls alone and the
streaming ones (step streams, the target's feature push) would go without. Hence one small class per kind.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

Rewrite = Callable[[grpc.aio.ClientCallDetails], grpc.aio.ClientCallDetails]


class _Rewriting:
    def __init__(self, rewrite: Rewrite) -> None:
        self._rewrite = rewrite


class UnaryUnaryRewriter(_Rewriting, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._rewrite(client_call_details), request)


class UnaryStreamRewriter(_Rewriting, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[override]
        return await continuation(self._rewrite(client_call_details), request)


class StreamUnaryRewriter(_Rewriting, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self._rewrite(client_call_details), request_iterator)


class StreamStreamRewriter(_Rewriting, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return await continuation(self._rewrite(client_call_details), request_iterator)


def rewriting_interceptors(rewrite: Rewrite) -> list[grpc.aio.ClientInterceptor]:
    """``rewrite`` applied to every call a channel makes, whatever its kind."""
    return [cls(rewrite) for cls in (UnaryUnaryRewriter, UnaryStreamRewriter, StreamUnaryRewriter, StreamStreamRewriter)]


def rewritten_metadata(interceptors, method: str) -> tuple[tuple[str, str], ...] | None:
    """The metadata ``interceptors`` would put on a call to ``method``, when every one of them only rewrites
    call details (this module's classes); None when one does something else and must stay on the channel.

    A stream can then carry that metadata itself on a channel without interceptors: grpc.aio runs an
    intercepted stream through a request queue and an extra task per message (grpc/aio/_interceptor.py)."""
    details = grpc.aio.ClientCallDetails(method, None, grpc.aio.Metadata(), None, None)
    for interceptor in interceptors:
        if not isinstance(interceptor, _Rewriting):
            return None
        if isinstance(interceptor, StreamStreamRewriter):  # one per call kind: apply each rewrite once
            details = interceptor._rewrite(details)
    return tuple(details.metadata or ())
