"""A minimal OTLP/gRPC trace receiver in the harness: the services export their spans to it.

    with SpanSink() as sink:                  # listens on 127.0.0.1:<free port>
        env = sink.service_env()              # TANDEM_TRACE_EXPORTER=otlp, TANDEM_OTLP_ENDPOINT=..., OTEL_BSP_*
        ... run the stack with env, stop it (the services flush their spans on SIGTERM) ...
        spans = sink.spans()                  # list[Span], from all three services

The spans are the ones architecture.md §6 specifies (scheduler phases, model-service
server spans); bench.overhead reads where iteration time goes from them. The
batch processor's queue is raised so a busy run drops nothing, and its delay
shortened so spans arrive while the run goes on.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v) -> object:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class _Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[Span] = []

    def Export(self, request, context):  # noqa: N802 - gRPC method name
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            name=s.name,
                            service=service,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                        )
                    )
        with self.lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()


class SpanSink:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._receiver = _Receiver()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2),
            options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self._receiver, self._server)
        self.port = self._server.add_insecure_port(f"{host}:0")
        self.endpoint = f"http://{host}:{self.port}"

    def start(self) -> SpanSink:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=1.0)

    def __enter__(self) -> SpanSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def service_env(self) -> dict[str, str]:
        """Environment for the services so that they export here."""
        return {
            "TANDEM_TRACE_EXPORTER": "otlp",
            "TANDEM_OTLP_ENDPOINT": self.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "1000",
            "OTEL_BSP_MAX_QUEUE_SIZE": "262144",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "2048",
        }

    def spans(self) -> list[Span]:
        with self._receiver.lock:
            return list(self._receiver.spans)

    def clear(self) -> None:
        with self._receiver.lock:
            self._receiver.spans.clear()
