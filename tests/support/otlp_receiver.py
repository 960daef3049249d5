"""An in-memory OTLP/gRPC trace receiver: what Jaeger or Phoenix would get, for tests to read.

    with OtlpReceiver() as receiver:          # listens on 127.0.0.1, any free port
        env = {"TANDEM_TRACE_EXPORTER": "otlp", "TANDEM_OTLP_ENDPOINT": receiver.endpoint}
        ...                                   # processes export their spans to it
        spans = receiver.spans()              # every span received so far, flattened
        traces = receiver.traces()            # trace id -> its spans

It implements opentelemetry.proto's TraceService/Export and nothing else, so
the services' real OTLP exporter (batching, protobuf, gRPC) is what is tested.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    service: str  # the resource's service.name
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # span ids of linked spans

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: list[ReceivedSpan], lock: threading.Lock) -> None:
        self._sink, self._lock = sink, lock

    def Export(self, request, context):  # noqa: N802 - the gRPC method's name
        received = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    received.append(
                        ReceivedSpan(
                            trace_id=s.trace_id.hex(), span_id=s.span_id.hex(), parent_span_id=s.parent_span_id.hex(),
                            name=s.name, service=str(resource.get("service.name", "")),
                            start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=tuple(link.span_id.hex() for link in s.links),
                        )  # fmt: skip
                    )
        with self._lock:
            self._sink.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self._spans, self._lock), self._server)
        self.port = self._server.add_insecure_port(f"{host}:0")
        self.endpoint = f"http://{host}:{self.port}"

    def __enter__(self) -> "OtlpReceiver":
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(None)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def traces(self) -> dict[str, list[ReceivedSpan]]:
        out: dict[str, list[ReceivedSpan]] = defaultdict(list)
        for s in self.spans():
            out[s.trace_id].append(s)
        return dict(out)
