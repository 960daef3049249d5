"""Server and client interceptors: errors become status codes, trace context travels.

Handlers hold no try/except of their own. Two server interceptors wrap every
method (unary and streaming, coroutine or async-generator handlers)::

    request ─▶ ErrorInterceptor ─▶ TracingServerInterceptor ─▶ handler
               (exception → status)  (span from the caller's traceparent)

The error interceptor is the outer one, so the span sees the original
exception (type, stack) and the caller sees a clean status. Mapping, first
match wins (see ``status_for_exception``):

    has ``grpc_code`` (shared.errors.TandemError)  → that code, str(exc)
    pydantic.ValidationError, ValueError             → INVALID_ARGUMENT
    NotImplementedError                              → UNIMPLEMENTED
    TimeoutError (asyncio's too)                     → DEADLINE_EXCEEDED
    anything else                                    → INTERNAL, traceback logged

``context.abort()`` inside a handler and client cancellation pass through
untouched. The server never crashes on a handler error.

Trace context is W3C ``traceparent``/``tracestate`` (+ ``baggage``) in gRPC
metadata. The client interceptors (``tracing_client_interceptors()`` for
grpc.aio, ``SyncTracingClientInterceptor`` for blocking channels; see
shared.rpc.channel) inject the *current* OpenTelemetry context
(they create no span: callers such as the scheduler own the meaningful spans —
speculate, verify — around their calls). Propagators are instances held here,
not OpenTelemetry's global propagator.

Handlers must be ``async def`` or async generators; a plain function is called
inline on the event loop.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from shared.rpc.call_details import rewriting_interceptors
import grpc.aio
import pydantic
from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

MAX_DETAILS_CHARS = 2000  # status details travel in a header; keep them well under its 8 KiB limit
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"

# Exceptions that are the RPC machinery's own business, never mapped.
_PASSTHROUGH = (asyncio.CancelledError, grpc.aio.AbortError, GeneratorExit, KeyboardInterrupt, SystemExit)


def w3c_propagator() -> TextMapPropagator:
    """traceparent/tracestate plus baggage: what the services exchange."""
    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


# ---------------------------------------------------------------------------
# Exception -> status
# ---------------------------------------------------------------------------


def _as_status_code(code: Any) -> grpc.StatusCode:
    if isinstance(code, grpc.StatusCode):
        return code
    return getattr(grpc.StatusCode, str(code).upper(), grpc.StatusCode.INTERNAL)


def _validation_message(exc: pydantic.ValidationError) -> str:
    errors = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors(include_url=False)
    )
    return f"invalid {exc.title}: {errors}"


def status_for_exception(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and details message a handler exception becomes."""
    code = getattr(exc, "grpc_code", None)
    if code is not None:
        return _as_status_code(code), _truncate(str(exc) or type(exc).__name__)
    if isinstance(exc, pydantic.ValidationError):  # a ValueError too; nicer message
        return grpc.StatusCode.INVALID_ARGUMENT, _truncate(_validation_message(exc))
    if isinstance(exc, ValueError):
        return grpc.StatusCode.INVALID_ARGUMENT, _truncate(str(exc) or type(exc).__name__)
    if isinstance(exc, NotImplementedError):
        return grpc.StatusCode.UNIMPLEMENTED, _truncate(str(exc) or "not implemented")
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED, _truncate(str(exc) or "timed out")
    return grpc.StatusCode.INTERNAL, _truncate(f"{type(exc).__name__}: {exc}")


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_DETAILS_CHARS else text[: MAX_DETAILS_CHARS - 3] + "..."


# ---------------------------------------------------------------------------
# Handler wrapping, shared by both server interceptors
# ---------------------------------------------------------------------------

Behavior = Callable[..., Any]
# wrap(behavior, method) -> behavior; must keep the kind (coroutine fn / async generator fn).
Wrapper = Callable[[Behavior, str], Behavior]


def _wrap_handler(handler: grpc.RpcMethodHandler | None, method: str, wrap: Wrapper) -> grpc.RpcMethodHandler | None:
    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        factory, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
    elif handler.request_streaming:
        factory, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
    elif handler.response_streaming:
        factory, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
    else:
        factory, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
    return factory(
        wrap(behavior, method),
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


async def _call(behavior: Behavior, request: Any, context: grpc.aio.ServicerContext) -> Any:
    result = behavior(request, context)
    if inspect.isawaitable(result):
        result = await result
    return result


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Turns handler exceptions into gRPC statuses (see the module docstring for the mapping)."""

    def __init__(self, log: logging.Logger | None = None) -> None:
        self._log = log or logger

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        return _wrap_handler(handler, handler_call_details.method, self._wrap)

    async def _abort(self, context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
        code, details = status_for_exception(exc)
        if code == grpc.StatusCode.INTERNAL:
            self._log.error("%s failed: %s", method, details, exc_info=exc)
        else:
            self._log.info("%s -> %s: %s", method, code.name, details)
        metadata = getattr(exc, "trailing_metadata", None)  # e.g. a retry hint (grpc-retry-pushback-ms)
        await context.abort(code, details, metadata if isinstance(metadata, tuple) else ())  # raises AbortError, which grpc turns into the status

    def _wrap(self, behavior: Behavior, method: str) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    async for item in behavior(request, context):
                        yield item
                except _PASSTHROUGH:
                    raise
                except BaseException as exc:  # noqa: BLE001 - this is the one place that catches all
                    await self._abort(context, exc, method)

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await _call(behavior, request, context)
            except _PASSTHROUGH:
                raise
            except BaseException as exc:  # noqa: BLE001
                await self._abort(context, exc, method)

        return unary


# ---------------------------------------------------------------------------
# Tracing
# ---------------------------------------------------------------------------


def _metadata_carrier(metadata: Sequence[Any] | None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    for item in metadata or ():
        key, value = item[0], item[1]  # _Metadatum or (key, value)
        if isinstance(value, str):
            carrier[key.lower()] = value
    return carrier


class TracingServerInterceptor(grpc.aio.ServerInterceptor):
    """Starts a SERVER span per call, parented on the caller's W3C trace context.

    The span is the current span while the handler runs, so spans the handler
    opens are its children. Attributes follow the OpenTelemetry RPC conventions
    (``rpc.system``, ``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``).
    Without ``tracer_provider`` the global one is used (a no-op unless set).

    Methods under ``skip_method_prefixes`` (health checks) are never traced. With
    ``only_in_trace`` a call is traced only when it carries a valid trace context:
    what the internal services use, so their spans always sit inside a request's
    trace and a caller's probes (Info at startup, releases no request owns) make
    no roots of their own.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        skip_method_prefixes: Sequence[str] = (HEALTH_METHOD_PREFIX,),
        *,
        only_in_trace: bool = False,
    ) -> None:
        self._tracer = trace.get_tracer("tandem.rpc", tracer_provider=tracer_provider)
        self._propagator = propagator or w3c_propagator()
        self._skip = tuple(skip_method_prefixes)
        self._only_in_trace = only_in_trace

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(self._skip):
            return handler
        parent = self._propagator.extract(_metadata_carrier(handler_call_details.invocation_metadata))
        if self._only_in_trace and not trace.get_current_span(parent).get_span_context().is_valid:
            return handler
        return _wrap_handler(handler, method, lambda behavior, m: self._wrap(behavior, m, parent))

    def _start(self, method: str, parent: Any) -> Any:
        service, _, name = method.lstrip("/").partition("/")
        return self._tracer.start_as_current_span(
            f"{service}/{name}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
            record_exception=False,
            set_status_on_exception=False,
        )

    @staticmethod
    def _finish(span: trace.Span, context: grpc.aio.ServicerContext, exc: BaseException | None) -> None:
        if exc is None:
            code = _context_code(context) or grpc.StatusCode.OK
        elif isinstance(exc, asyncio.CancelledError):
            code = grpc.StatusCode.CANCELLED
        elif isinstance(exc, grpc.aio.AbortError):
            code = _context_code(context) or grpc.StatusCode.UNKNOWN
        else:
            code = status_for_exception(exc)[0]
            span.record_exception(exc)
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code != grpc.StatusCode.OK:
            span.set_status(Status(StatusCode.ERROR, code.name))

    def _wrap(self, behavior: Behavior, method: str, parent: Any) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with self._start(method, parent) as span:
                    try:
                        async for item in behavior(request, context):
                            yield item
                    except BaseException as exc:
                        self._finish(span, context, exc)
                        raise
                    self._finish(span, context, None)

            return stream

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            with self._start(method, parent) as span:
                try:
                    result = await _call(behavior, request, context)
                except BaseException as exc:
                    self._finish(span, context, exc)
                    raise
                self._finish(span, context, None)
                return result

        return unary


def _context_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode | None:
    try:
        code = context.code()
    except Exception:  # noqa: BLE001 - older grpc builds lack code() on aio contexts
        return None
    if code is None:
        return None
    return code if isinstance(code, grpc.StatusCode) else _status_from_int(code)


def _status_from_int(value: int) -> grpc.StatusCode | None:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return None


def default_server_interceptors(
    tracer_provider: TracerProvider | None = None,
    *,
    untraced_methods: Sequence[str] = (HEALTH_METHOD_PREFIX,),
    only_in_trace: bool = False,
) -> list[grpc.aio.ServerInterceptor]:
    """[ErrorInterceptor, TracingServerInterceptor]: error mapping outermost (tracing options: see the latter)."""
    tracing = TracingServerInterceptor(tracer_provider, skip_method_prefixes=untraced_methods, only_in_trace=only_in_trace)
    return [ErrorInterceptor(), tracing]


# ---------------------------------------------------------------------------
# Client side: inject the current trace context
# ---------------------------------------------------------------------------


def _inject(metadata: Any, propagator: TextMapPropagator) -> list[tuple[str, str | bytes]] | None:
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    if not carrier:
        return list(metadata) if metadata is not None else None
    kept = [(k, v) for k, v in (metadata or ()) if k.lower() not in carrier]
    return kept + list(carrier.items())


class _AioInjector:
    def __init__(self, propagator: TextMapPropagator | None = None) -> None:
        self._propagator = propagator or w3c_propagator()

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = _inject(details.metadata, self._propagator)
        return details._replace(metadata=grpc.aio.Metadata(*metadata) if metadata is not None else None)


def tracing_client_interceptors(propagator: TextMapPropagator | None = None) -> list[grpc.aio.ClientInterceptor]:
    """grpc.aio client interceptors that put the current trace context into each call's metadata.

    One per call kind (call_details.py: a grpc.aio channel files each interceptor under the first kind it
    implements only).
    """
    return rewriting_interceptors(_AioInjector(propagator)._details)


class _SyncCallDetails(
    collections.namedtuple(
        "_SyncCallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


class SyncTracingClientInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Synchronous-channel counterpart of ``TracingClientInterceptor`` (used by the sync SDK client)."""

    def __init__(self, propagator: TextMapPropagator | None = None) -> None:
        self._propagator = propagator or w3c_propagator()

    def _details(self, d: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _SyncCallDetails(
            d.method,
            d.timeout,
            _inject(d.metadata, self._propagator),
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[override]
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # type: ignore[override]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[override]
        return continuation(self._details(client_call_details), request_iterator)
