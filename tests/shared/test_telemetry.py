"""Tracing setup: exporters, service.name on every span, no global state unless asked."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from shared.telemetry import TracingConfig, setup_tracing


def test_memory_exporter_and_service_name_on_spans() -> None:
    provider = setup_tracing("draft", exporter="memory")
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("speculate") as parent:
        with tracer.start_as_current_span("forward"):
            pass
    spans = provider.memory_exporter.get_finished_spans()
    assert [s.name for s in spans] == ["forward", "speculate"]
    for span in spans:
        assert span.attributes["service.name"] == "draft"  # for Phoenix, which ignores resources
        assert span.resource.attributes["service.name"] == "draft"
        assert span.context.trace_id == parent.get_span_context().trace_id
    assert trace.get_tracer_provider() is not provider  # nothing global unless set_global=True


def test_exporter_kinds() -> None:
    custom = InMemorySpanExporter()
    assert setup_tracing("x", exporter=custom).exporter is custom
    assert setup_tracing("x", exporter="none").exporter is None
    console = setup_tracing("x", exporter="console")
    assert type(console.exporter).__name__ == "ConsoleSpanExporter"
    otlp = TracingConfig(service_name="target", exporter="otlp", endpoint="http://127.0.0.1:1").setup()
    assert type(otlp.exporter).__name__ == "OTLPSpanExporter"
    for provider in (console, otlp):
        provider.shutdown()  # no spans: returns at once, even with nothing listening
    with pytest.raises(TypeError):
        setup_tracing("x", exporter="none").memory_exporter
    with pytest.raises(ValueError, match="unknown trace exporter"):
        setup_tracing("x", exporter="jaeger-thrift")  # type: ignore[arg-type]
