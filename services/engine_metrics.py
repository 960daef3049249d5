"""Prometheus metrics of one model service (target or draft), on TANDEM_METRICS_PORT of that service.

    tandem_engine_call_seconds{role,call}        histogram: time on the engine thread per call (a step, a
                                                 speculate, a release); rate(_sum) / rate(_count) = mean
    tandem_engine_queue_seconds{role}            histogram: time a call waited behind earlier ones
    tandem_engine_batch_sequences{role,call}     histogram: sequences in one call's batch
    tandem_engine_batched_tokens_total{role}     counter: tokens run through the model (prefill + decode + tree)
    tandem_kv_blocks{role,state}                 gauge: KV blocks "used" and "free"; usage = used / (used + free)
    tandem_live_sequences{role}                  gauge: sequences holding KV
    tandem_target_steps_total{path}              counter: verify steps by path: "static" (one host read,
                                                 static_step.py), "static_host_accept" (its sampled/processed
                                                 variant), "eager" (the eager forward)
    tandem_cuda_graph_replays_total              counter: static steps replayed from a captured CUDA graph
    tandem_cuda_graph_eager_total                counter: static steps whose shape had no graph bucket

Gauges and the engine's own counters are read at scrape time (a collector), so an engine call pays only
for the histograms. Ratios are left to PromQL over these counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CALL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class EngineMetrics:
    def __init__(self, host, registry: CollectorRegistry | None = None) -> None:
        self.host = host
        self.role = host.role
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = self.registry
        self.call_seconds = Histogram("tandem_engine_call_seconds", "Time on the engine thread per call.",
                                      ["role", "call"], registry=reg, buckets=CALL_BUCKETS)  # fmt: skip
        self.queue_seconds = Histogram("tandem_engine_queue_seconds", "Time a call waited behind earlier calls.",
                                       ["role"], registry=reg, buckets=CALL_BUCKETS)  # fmt: skip
        self.batch_sequences = Histogram("tandem_engine_batch_sequences", "Sequences in one call's batch.",
                                         ["role", "call"], registry=reg, buckets=BATCH_BUCKETS)  # fmt: skip
        self._tokens = 0
        reg.register(_EngineCollector(self))

    def observe_call(self, fn, args: tuple, queue_ns: int, work_ns: int, result: object) -> None:
        call = getattr(fn, "__name__", "call").lstrip("_").removeprefix("engine_")  # _engine_step -> step
        self.call_seconds.labels(self.role, call).observe(work_ns / 1e9)
        self.queue_seconds.labels(self.role).observe(queue_ns / 1e9)
        batch = sum(len(a) for a in args if isinstance(a, list))
        if batch:
            self.batch_sequences.labels(self.role, call).observe(batch)
        for cost in _costs(result):
            self._tokens += cost.num_batched_tokens

    def exposition(self) -> tuple[bytes, str]:
        import prometheus_client

        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST


def _costs(result: object) -> list:
    cost = getattr(result, "cost", None)
    if cost is not None and hasattr(cost, "num_batched_tokens"):
        return [cost]
    if isinstance(result, tuple):
        return [c for item in result for c in (item if isinstance(item, list) else [item])
                if hasattr(c, "num_batched_tokens")]  # fmt: skip
    if isinstance(result, list):
        return [c for c in result if hasattr(c, "num_batched_tokens")]
    return []


class _EngineCollector:
    """What the engine counts itself, read at scrape time."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self.metrics = metrics

    def describe(self):
        return []

    def collect(self):
        m, role = self.metrics, self.metrics.role
        engine = m.host.engine
        tokens = CounterMetricFamily("tandem_engine_batched_tokens", "Tokens run through the model.", labels=["role"])
        tokens.add_metric([role], m._tokens)
        yield tokens
        live = GaugeMetricFamily("tandem_live_sequences", "Sequences the engine holds.", labels=["role"])
        live.add_metric([role], len(getattr(engine.runner, "seqs", {})))
        yield live
        cache = m.host.kv_cache
        if cache is not None:
            blocks = GaugeMetricFamily("tandem_kv_blocks", "KV cache blocks by state.", labels=["role", "state"])
            free = cache.num_free_blocks
            blocks.add_metric([role, "used"], cache.num_blocks - free)
            blocks.add_metric([role, "free"], free)
            yield blocks
        steps = getattr(engine, "step_paths", None)
        if steps is not None:
            family = CounterMetricFamily("tandem_target_steps", "Verify steps by path.", labels=["path"])
            static = getattr(engine, "static", None)
            host_accept = static.num_host_accept if static is not None else 0
            family.add_metric(["static"], steps.get("static", 0) - host_accept)
            family.add_metric(["static_host_accept"], host_accept)
            family.add_metric(["eager"], steps.get("eager", 0))
            yield family
            graphs = getattr(static, "graphs", None) if static is not None else None
            replays = CounterMetricFamily("tandem_cuda_graph_replays", "Static steps replayed from a CUDA graph.")
            replays.add_metric([], getattr(graphs, "replays", 0))
            yield replays
            eager = CounterMetricFamily("tandem_cuda_graph_eager", "Static steps whose shape had no graph bucket.")
            eager.add_metric([], getattr(graphs, "eager", 0))
            yield eager
