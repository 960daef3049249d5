"""One SERVER span per step-stream message, in the trace of the scheduler's step (docs/services.md).

A unary call gets its span from the tracing interceptor, parented on the caller's metadata. A step
stream is one long call, opened outside any trace, so each plan carries the W3C context of the
scheduler span it belongs to (``trace_context``) and the handler opens the span itself, named after
what the plan does, as the unary method would have been (``tandem.v1.TargetService/Verify``)::

    with plan_span(provider, "tandem.v1.TargetService", "Verify", plan.trace_context):
        ...  # annotate() adds to it, as in a unary handler

A plan without a valid context (a release nobody's trace owns) makes no span.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from opentelemetry import trace
from opentelemetry.trace import SpanKind

from shared.rpc.interceptors import w3c_propagator

_PROPAGATOR = w3c_propagator()


def trace_carrier() -> dict[str, str]:
    """The current OpenTelemetry context as W3C headers (the client's side: goes in ``trace_context``)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


@contextlib.contextmanager
def plan_span(provider, service: str, name: str, carrier: Mapping[str, str]) -> Iterator[trace.Span | None]:
    if not carrier:
        yield None
        return
    parent = _PROPAGATOR.extract(dict(carrier))
    if not trace.get_current_span(parent).get_span_context().is_valid:
        yield None
        return
    tracer = trace.get_tracer("tandem.rpc", tracer_provider=provider)
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name, "tandem.step_stream": True}
    with tracer.start_as_current_span(f"{service}/{name}", context=parent, kind=SpanKind.SERVER,
                                      attributes=attributes) as span:  # fmt: skip
        yield span
