"""Prometheus metrics from the iteration loop (shared.metrics.TandemMetrics, architecture.md §6).

    on_step     per request: draft tokens proposed/accepted, accepted length, per-position acceptance,
                the chosen k (histogram; the step's mean k as a gauge); draft offloads/reloads,
                KV pool resizes and the KV token budget. Summed per step and flushed to the series every
                FLUSH_S and before every scrape (shared/metric_flush.py)
    on_finish   TTFT, TPOT, SLO attainment, goodput tokens, finish reason
    scrapes     queue depth and running requests, read from the scheduler then (``read_load``)

Requests are labelled by SLO class (services.scheduler.slo_class), a bucket
of their TPOT target, so the label set stays small whatever targets clients send.
"""

from __future__ import annotations

from scheduler.engine_loop import Scheduler
from scheduler.report import StepReport
from scheduler.request import Request
from services.scheduler.slo_class import slo_class
from shared.metric_flush import StepBatch
from shared.metrics import TandemMetrics
from shared.step_tally import StepTally


class MetricsObserver:
    deferrable = True  # runs while the next step's workers compute (scheduler/observer_calls.py)

    def __init__(self, metrics: TandemMetrics, scheduler: Scheduler) -> None:
        self.metrics = metrics
        self.scheduler = scheduler
        self._feature_bytes = (0, 0, 0)  # the relay's all-time (in, out, pushed) at the last flush
        self._prefill = (0, 0)  # chunked prefill's all-time (chunks, cached tokens) at the last flush
        self._relay = (0, 0, 0, 0, 0)  # the draft relay's counts at the last flush
        self._grammar_ns = {"target": 0, "draft": 0}  # the workers' all-time grammar time at the last flush
        self._inner: dict[int, tuple[object, object]] = {}  # id(worker) -> (worker, what holds its grammar_ns)
        self._tally = StepTally(metrics.max_positions)  # the steps since the last flush (shared/metric_flush.py)
        self._batch = StepBatch(metrics.registry, self.flush)
        metrics.read_load(waiting=lambda: len(scheduler.waiting), running=lambda: len(scheduler.running))

    def on_step(self, report: StepReport) -> None:
        plain = 0  # outcomes without a draft: counted together (most of a batch when nothing speculates)
        steps, ks = [], []
        for o in report.outcomes:
            shape = o.shape
            ks.append(shape.max_depth)
            if not o.num_drafted and not o.num_pruned:
                plain += 1
                continue
            depth = o.num_drafted if shape.kind == "chain" else shape.max_depth
            steps.append((o.num_drafted, o.num_accepted, depth, o.num_pruned))
        with self._batch.lock:
            t = self._tally
            t.add_steps(steps)
            t.add_plain(plain)
            t.add_speculation(ks)
            t.preempted += len(report.preempted_ids)
            t.resumed += len(report.resumed_ids)
            t.evicted += len(report.evicted_ids)
        self.metrics.observe_draft_memory(  # events are rare; the gauges are set only on a change
            event=report.draft_memory_event,
            offloaded=report.draft_offloaded,
            pool_event=report.kv_pool_event,
            kv_token_budget=report.kv_token_budget,
        )
        if self._batch.due():
            self.flush()

    def flush(self) -> None:
        """The steps since the last flush into the series, and the all-time counts read since then (from the loop
        every ``FLUSH_S``, and from a scrape's thread before it collects)."""
        with self._batch.lock:
            tally, self._tally = self._tally, StepTally(self.metrics.max_positions)
            self.metrics.apply(tally)
            relay = self.scheduler.features
            if relay is not None:
                now = (relay.bytes_in, relay.bytes_out, relay.bytes_pushed)
                last = self._feature_bytes
                self.metrics.observe_feature_bytes(received=now[0] - last[0], sent=now[1] - last[1],
                                                   pushed=now[2] - last[2])  # fmt: skip
                self._feature_bytes = now
            self._observe_relay()
            chunks = self.scheduler.chunks
            self.metrics.observe_prefill(chunks=chunks.num_chunks - self._prefill[0],
                                         cached_tokens=chunks.num_cached_tokens - self._prefill[1])  # fmt: skip
            self._prefill = (chunks.num_chunks, chunks.num_cached_tokens)
            self._observe_grammar()

    def _observe_relay(self) -> None:
        relay, ahead = getattr(self.scheduler, "relay", None), getattr(self.scheduler, "verify_ahead", None)
        if relay is None:
            return
        looked = getattr(self._unwrapped(self.scheduler.target), "relay_lookaheads", 0)
        now = (relay.num_relayed, relay.gate.num_misses, relay.num_missed, ahead.num_sent if ahead is not None else 0,
               looked if isinstance(looked, int) else 0)  # fmt: skip
        last = self._relay
        self.metrics.observe_relay(handed_off=now[0] - last[0], dropped=now[1] - last[1], missed=now[2] - last[2],
                                   verify_ahead=now[3] - last[3], lookahead=now[4] - last[4])  # fmt: skip
        self._relay = now

    def _observe_grammar(self) -> None:
        for service, worker in (("target", self.scheduler.target), ("draft", self.scheduler.draft)):
            total = getattr(self._unwrapped(worker), "grammar_ns", 0)
            if isinstance(total, int) and total > self._grammar_ns[service]:
                self.metrics.grammar_seconds_total.labels(service=service).inc((total - self._grammar_ns[service]) / 1e9)
                self._grammar_ns[service] = total

    def _unwrapped(self, worker):
        """A link's worker (it wraps one), or the worker; asked once per worker object: through the tracing and
        ledger wrappers a missing ``worker`` attribute costs an AttributeError raised through each."""
        known = self._inner.get(id(worker))
        if known is not None and known[0] is worker:
            return known[1]
        inner = getattr(worker, "worker", worker)
        self._inner[id(worker)] = (worker, inner)
        return inner

    def on_finish(self, request: Request) -> None:
        self.metrics.observe_request(
            ttft_s=request.ttft,
            tpot_s=request.tpot,
            num_tokens=len(request.output_ids),
            finish_reason=request.finish_reason.value if request.finish_reason else "error",
            slo_tpot_ms=request.slo.tpot_ms,
            slo_ttft_ms=request.slo.ttft_ms,
            slo_class=slo_class(request.slo),
        )
