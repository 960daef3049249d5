"""OpenTelemetry tracing setup for the three services and the tests.

    provider = setup_tracing("target", exporter="otlp", endpoint="http://jaeger:4317")
    server = create_server(tracer_provider=provider)   # shared.rpc.server
    tracer = provider.get_tracer("tandem.target")

Every span gets ``service.name`` twice: as a resource attribute (what Jaeger
reads) and as a span attribute, copied by ``ServiceNameSpanProcessor``,
because Arize Phoenix ignores resource attributes. The resource also names
the Phoenix project the traces belong to (``openinference.project.name``,
default ``tandem``; OTEL_RESOURCE_ATTRIBUTES may name another).

Globals: OpenTelemetry keeps one process-wide tracer provider (and one
propagator), settable once. ``setup_tracing`` does not touch them unless
``set_global=True`` (what a service's main does, so third-party
instrumentation finds the provider); everything in Tandem takes the provider
as an argument instead, which is how tests run several providers in one
process. The propagator used on the wire is built in shared.rpc.interceptors.
"""

from __future__ import annotations

from typing import Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, Field

ExporterKind = Literal["otlp", "console", "none", "memory"]

DEFAULT_OTLP_ENDPOINT = "http://127.0.0.1:4317"
PROJECT_NAME = "openinference.project.name"  # the resource attribute Arize Phoenix files traces by
DEFAULT_PROJECT = "tandem"


class TracingConfig(BaseModel):
    """How a process exports its traces."""

    service_name: str = Field("tandem", description="service.name of every span (e.g. scheduler, draft, target).")
    exporter: ExporterKind = Field(
        "none",
        description="otlp: OTLP/gRPC to `endpoint` (Jaeger, Phoenix, a collector); console: print spans; "
        "memory: keep them in memory (tests); none: spans are created but not exported.",
    )
    endpoint: str | None = Field(
        None, description=f"OTLP/gRPC endpoint for exporter=otlp; default {DEFAULT_OTLP_ENDPOINT}."
    )

    def setup(self, set_global: bool = False) -> "TandemTracerProvider":
        """``setup_tracing`` with these settings."""
        return setup_tracing(self.service_name, self.exporter, self.endpoint, set_global=set_global)


class ServiceNameSpanProcessor(SpanProcessor):
    """Copies service.name onto each span as a span attribute when the span starts."""

    def __init__(self, service_name: str) -> None:
        self._service_name = service_name

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        span.set_attribute(SERVICE_NAME, self._service_name)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class TandemTracerProvider(TracerProvider):
    """A TracerProvider that keeps a handle on its exporter.

    ``exporter`` is the ``InMemorySpanExporter`` for exporter="memory" (read
    finished spans with ``provider.exporter.get_finished_spans()``), the
    exporter in use otherwise, and None for exporter="none".
    """

    exporter: SpanExporter | None = None

    @property
    def memory_exporter(self) -> InMemorySpanExporter:
        if not isinstance(self.exporter, InMemorySpanExporter):
            raise TypeError(f"this provider exports to {type(self.exporter).__name__}, not to memory")
        return self.exporter


def _otlp_exporter(endpoint: str | None) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    endpoint = endpoint or DEFAULT_OTLP_ENDPOINT
    return OTLPSpanExporter(endpoint=endpoint, insecure=not endpoint.startswith("https://"))


def setup_tracing(
    service_name: str,
    exporter: ExporterKind | SpanExporter = "none",
    endpoint: str | None = None,
    *,
    set_global: bool = False,
) -> TandemTracerProvider:
    """A tracer provider for ``service_name`` exporting as asked.

    ``exporter`` may also be a SpanExporter instance (exported synchronously).
    OTLP and console export in batches; call ``provider.shutdown()`` at exit to
    flush. With ``set_global`` the provider also becomes OpenTelemetry's global
    one (allowed once per process).
    """
    resource = Resource.create({SERVICE_NAME: service_name})
    if PROJECT_NAME not in resource.attributes:  # OTEL_RESOURCE_ATTRIBUTES may name another project
        resource = resource.merge(Resource({PROJECT_NAME: DEFAULT_PROJECT}))
    provider = TandemTracerProvider(resource=resource)
    provider.add_span_processor(ServiceNameSpanProcessor(service_name))
    if isinstance(exporter, SpanExporter):
        provider.exporter = exporter
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif exporter == "memory":
        provider.exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(provider.exporter))
    elif exporter == "console":
        provider.exporter = ConsoleSpanExporter(service_name=service_name)
        provider.add_span_processor(BatchSpanProcessor(provider.exporter))
    elif exporter == "otlp":
        provider.exporter = _otlp_exporter(endpoint)
        provider.add_span_processor(BatchSpanProcessor(provider.exporter))
    elif exporter != "none":
        raise ValueError(f"unknown trace exporter {exporter!r}; expected otlp, console, memory or none")
    if set_global:
        trace.set_tracer_provider(provider)
    return provider
