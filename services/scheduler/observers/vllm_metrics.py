"""The scheduler's metrics under vLLM's names, for the routers that scrape them (llm-d's endpoint picker,
KServe, vLLM's production stack), every series labelled ``model_name``.

    vllm:num_requests_running / vllm:num_requests_waiting          gauges: requests holding KV / queued
    vllm:kv_cache_usage_perc                                       gauge, 0..1: the share of the KV token
                                                                   budget reserved by running and resident
                                                                   requests (what admission sees)
    vllm:spec_decode_num_drafts_total                              verify steps of a request that carried a draft
    vllm:spec_decode_num_draft_tokens_total / _num_accepted_tokens_total
    vllm:spec_decode_num_accepted_tokens_per_pos_total{position}   accepted draft tokens at each depth
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (between the steps that emitted),
    vllm:e2e_request_latency_seconds                               histograms
    vllm:prompt_tokens_total, vllm:generation_tokens_total         counters
    vllm:request_success_total{finished_reason}                    finished requests ("stop", "length", "abort")

Acceptance rate = rate(num_accepted_tokens) / rate(num_draft_tokens); mean acceptance length =
1 + rate(num_accepted_tokens) / rate(num_drafts): both sum across replicas.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from scheduler.engine_loop import Scheduler
from scheduler.policies.queue import reserved_tokens
from scheduler.report import StepReport
from scheduler.request import FinishReason, Request
from shared.metric_flush import StepBatch
from shared.metrics import TPOT_BUCKETS, TTFT_BUCKETS, observe_all

E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0)  # fmt: skip
MAX_POSITIONS = 16
_REASONS = {FinishReason.LENGTH: "length", FinishReason.STOP_TOKEN: "stop", FinishReason.STOP_STRING: "stop",
            FinishReason.ABORTED: "abort", FinishReason.ERROR: "error"}  # fmt: skip


class _Children:
    """The per-step series of one model: the label lookups done once."""

    def __init__(self, obs: "VllmMetricsObserver") -> None:
        self.model = m = obs.model
        self.running, self.waiting, self.kv_usage = obs.running.labels(m), obs.waiting.labels(m), obs.kv_usage.labels(m)
        self.drafts, self.draft_tokens = obs.drafts.labels(m), obs.draft_tokens.labels(m)
        self.accepted_tokens, self.generation_tokens = obs.accepted_tokens.labels(m), obs.generation_tokens.labels(m)
        self.ttft, self.e2e, self.itl = obs.ttft.labels(m), obs.e2e.labels(m), obs.itl.labels(m)
        self.prompt_tokens = obs.prompt_tokens.labels(m)
        self._per_pos, self._pos_children = obs.accepted_per_pos, {}

    def accepted_at(self, position: int):
        child = self._pos_children.get(position)
        if child is None:  # made at first use: a depth never accepted shows no series, as before
            child = self._pos_children[position] = self._per_pos.labels(self.model, str(position))
        return child


class VllmMetricsObserver:
    deferrable = True  # runs while the next step's workers compute (scheduler/observer_calls.py)

    def __init__(self, registry: CollectorRegistry, scheduler: Scheduler, model_name: str) -> None:
        self.scheduler = scheduler
        self.model = model_name
        label, reg = ["model_name"], registry
        self.running = Gauge("vllm:num_requests_running", "Requests holding KV cache.", label, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting for admission.", label, registry=reg)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "Share of the KV token budget reserved, 0..1.", label,
                              registry=reg)  # fmt: skip
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Verify steps that carried a draft.", label, registry=reg)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.", label, registry=reg)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", label,
                                       registry=reg)  # fmt: skip
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens at each position.", label + ["position"], registry=reg)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", label, registry=reg,
                              buckets=TTFT_BUCKETS)  # fmt: skip
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between a request's successive steps that "
                             "emitted tokens.", label, registry=reg, buckets=TPOT_BUCKETS)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to the last token.", label, registry=reg,
                             buckets=E2E_BUCKETS)  # fmt: skip
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", label, registry=reg)
        self.generation_tokens = Counter("vllm:generation_tokens", "Generated tokens.", label, registry=reg)
        self.success = Counter("vllm:request_success", "Finished requests.", label + ["finished_reason"], registry=reg)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(self.model, reason)
        self._children = c = _Children(self)  # this model's series, looked up once (``labels``: a lock and a dict)
        # the load, read from the scheduler when scraped: it changes every step and nobody reads it in between
        c.running.set_function(lambda: len(scheduler.running))
        c.waiting.set_function(lambda: len(scheduler.waiting))
        c.kv_usage.set_function(self._kv_usage)
        self._sums = [0, 0, 0, 0]  # drafts, draft tokens, accepted tokens, generated tokens since the last flush
        self._reached: dict[int, int] = {}
        self._batch = StepBatch(registry, self.flush)

    def on_step(self, report: StepReport) -> None:
        drafts = drafted = accepted = 0
        with self._batch.lock:  # a scrape's thread may flush meanwhile
            reached = self._reached  # accepted positions per drafting request, since the last flush
            for o in report.outcomes:
                if o.num_drafted:
                    drafts += 1
                    drafted += o.num_drafted
                    accepted += o.num_accepted
                    key = min(o.num_accepted, MAX_POSITIONS)
                    reached[key] = reached.get(key, 0) + 1
            self._sums[0] += drafts
            self._sums[1] += drafted
            self._sums[2] += accepted
            self._sums[3] += report.num_emitted
        if self._batch.due():
            self.flush()

    def flush(self) -> None:
        """The steps since the last flush into the series, one update per series (shared/metric_flush.py)."""
        c = self._children
        with self._batch.lock:
            (drafts, drafted, accepted, emitted), self._sums = self._sums, [0, 0, 0, 0]
            reached, self._reached = self._reached, {}
        if drafts:  # a counter's ``inc`` takes a lock
            c.drafts.inc(drafts)
            c.draft_tokens.inc(drafted)
            c.accepted_tokens.inc(accepted)
        at_least = 0
        for position in range(max(reached, default=0) - 1, -1, -1):
            at_least += reached.get(position + 1, 0)
            if at_least:
                c.accepted_at(position).inc(at_least)
        if emitted:
            c.generation_tokens.inc(emitted)

    def on_finish(self, request: Request) -> None:
        c = self._children
        if request.ttft is not None:
            c.ttft.observe(request.ttft)
        if request.arrival_time is not None and request.token_times:
            c.e2e.observe(max(0.0, request.token_times[-1] - request.arrival_time))
        steps = sorted(set(request.token_times))  # tokens of one step share its commit time
        observe_all(c.itl, [b - a for a, b in zip(steps, steps[1:])])
        c.prompt_tokens.inc(len(request.prompt_ids))
        self.success.labels(self.model, _REASONS.get(request.finish_reason, "error")).inc()

    def _kv_usage(self) -> float:
        """Share of the KV token budget the running and resident requests reserve (read when scraped, from the
        scraping thread: the tuples of requests are copies, made under the GIL in one C call each)."""
        s = self.scheduler
        held = sum(reserved_tokens(r) for r in s.running) + sum(reserved_tokens(r) for r in s.waiting if r.resident)
        return min(1.0, held / s.max_tokens_in_flight) if s.max_tokens_in_flight else 0.0
