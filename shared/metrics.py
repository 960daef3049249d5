"""Prometheus metrics of the serving loop (architecture.md §6), on a registry of their own.

    metrics = TandemMetrics()                      # its own CollectorRegistry, not the global one
    server, thread = start_http_server(9400, metrics.registry)
    metrics.observe_step(num_proposed=4, num_accepted=3)
    metrics.observe_request(ttft_s=0.12, tpot_s=0.031, num_tokens=128, slo_tpot_ms=50)

Definitions (per request, n generated tokens):

    TTFT  = t_first - t_arrival
    TPOT  = (t_last - t_first) / (n - 1)          (only when n >= 2)
    SLO attained  <=>  TPOT <= slo_tpot (and TTFT <= slo_ttft when set); no SLO counts as attained
    goodput    = rate(tandem_goodput_tokens_total)     tokens/s of SLO-meeting requests
    throughput = rate(tandem_generated_tokens_total)
    acceptance rate = rate(tandem_draft_tokens_accepted_total) / rate(tandem_draft_tokens_proposed_total)
    mean accepted length = rate(tandem_accepted_length_tokens_sum) / rate(tandem_accepted_length_tokens_count)

Every ratio is left to PromQL over counters (so replicas sum); names carry their unit (_seconds,
_tokens, _bytes, _total). The vLLM-named series routers scrape: services/scheduler/observers/vllm_metrics.py.

Labels are few and bounded: ``slo_class`` (a name the scheduler gives each SLO
tier, e.g. "tight"/"loose"/"none"), ``finish_reason``, ``position`` (capped at
``max_positions``), ``queue``.
"""

from __future__ import annotations

import collections
import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import partial
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from shared.metric_flush import FlushingRegistry
from shared.step_tally import StepTally

# Latency buckets in seconds: TTFT spans ms to tens of s under load; TPOT lives in 5-500 ms.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
LENGTH_BUCKETS = tuple(float(i) for i in range(1, 17)) + (24.0, 32.0)
SPEC_K_BUCKETS = tuple(float(i) for i in range(0, 17)) + (24.0, 32.0)


def observe_n(hist: Histogram, amount: float, n: int) -> None:
    """``n`` observations of one value at the cost of one (a batch's requests often share it: k = 0, length 1).

    Through prometheus_client's Histogram internals (``_sum``, ``_upper_bounds``, ``_buckets``: what its
    ``observe`` does once), else ``observe`` n times."""
    total, bounds, buckets = (getattr(hist, a, None) for a in ("_sum", "_upper_bounds", "_buckets"))
    if total is None or bounds is None or buckets is None:
        for _ in range(n):
            hist.observe(amount)
        return
    total.inc(amount * n)
    for i, bound in enumerate(bounds):
        if amount <= bound:
            buckets[i].inc(n)
            break


def observe_all(hist: Histogram, amounts: Sequence[float]) -> None:
    """Every value of ``amounts`` observed, each series touched once: the bucket of each value found by bisection
    (``observe`` takes the first bound at or above it: ``bisect_left``), then one ``inc`` per bucket used and one
    for the sum. A finished request's inter-token latencies are a few hundred values, and ``observe`` costs
    about 2 µs each. Through the same internals as ``observe_n``, else ``observe`` one by one."""
    total, bounds, buckets = (getattr(hist, a, None) for a in ("_sum", "_upper_bounds", "_buckets"))
    if total is None or bounds is None or buckets is None:
        for amount in amounts:
            hist.observe(amount)
        return
    if not amounts:
        return
    total.inc(sum(amounts))
    for i, n in collections.Counter(map(partial(bisect_left, bounds), amounts)).items():  # the last bound is +Inf
        buckets[i].inc(n)


class TandemMetrics:
    """Every metric the scheduler exports, registered on ``registry`` (a fresh one by default)."""

    def __init__(
        self, registry: CollectorRegistry | None = None, namespace: str = "tandem", max_positions: int = 16
    ) -> None:
        self.registry = registry if registry is not None else FlushingRegistry()  # observers flush before a scrape
        self.max_positions = max_positions
        ns, reg = namespace, self.registry

        self.ttft_seconds = Histogram(
            "ttft_seconds", "Time to first token.", ["slo_class"], namespace=ns, registry=reg, buckets=TTFT_BUCKETS
        )
        self.tpot_seconds = Histogram(
            "tpot_seconds", "Time per output token, (t_last - t_first) / (n - 1).", ["slo_class"],
            namespace=ns, registry=reg, buckets=TPOT_BUCKETS,
        )  # fmt: skip
        self.requests_total = Counter(
            "requests_total", "Finished requests.", ["finish_reason"], namespace=ns, registry=reg
        )
        self.slo_requests_total = Counter(
            "slo_requests_total", "Finished requests by SLO outcome; attainment = attained / all.",
            ["slo_class", "outcome"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.generated_tokens_total = Counter(
            "generated_tokens_total", "Generated tokens (rate = throughput).", namespace=ns, registry=reg
        )
        self.goodput_tokens_total = Counter(
            "goodput_tokens_total", "Tokens of requests that met their SLO (rate = goodput).",
            ["slo_class"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.draft_tokens_proposed_total = Counter(
            "draft_tokens_proposed_total", "Draft tokens sent to verification.", namespace=ns, registry=reg
        )
        self.draft_tokens_accepted_total = Counter(
            "draft_tokens_accepted_total", "Draft tokens accepted by the target.", namespace=ns, registry=reg
        )
        self.draft_tokens_pruned_total = Counter(
            "draft_tokens_pruned_total", "Draft tokens the target's token-wise early exit stopped before its last layer "
            "(FASER §4.2); counted among the proposed, never accepted.", namespace=ns, registry=reg,
        )  # fmt: skip
        self.feature_bytes_total = Counter(
            "feature_bytes_total", "Target feature bytes moved for a feature-level draft (hop: target->scheduler, "
            "scheduler->draft, or target->draft straight over step streams); their rate per step is what the EAGLE "
            "boundary costs on the wire.",
            ["hop"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.draft_relay_total = Counter(
            "draft_relay_total", "Draft relay over step streams (the target hands each verified step's tokens to the "
            "draft, whose next trees go straight back to it): requests handed off; relayed trees dropped because the "
            "plan changed shape; relayed trees that never came (missed: the request is resynchronised); verifies sent "
            "ahead of the commit under a fixed policy; relayed trees that were a lookahead, drafted on the prefix the "
            "step before turned out to commit (no wait for the draft).",
            ["event"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.accepted_length = Histogram(
            "accepted_length_tokens", "Tokens committed per request per verify step, bonus included (_sum / _count "
            "is the mean accepted length).",
            namespace=ns, registry=reg, buckets=LENGTH_BUCKETS,
        )  # fmt: skip
        self.position_proposed_total = Counter(
            "position_proposed_total", "Steps that proposed a draft token at this position (depth).",
            ["position"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.position_accepted_total = Counter(
            "position_accepted_total", "Steps that accepted the draft token at this position (depth).",
            ["position"], namespace=ns, registry=reg,
        )  # fmt: skip
        self._proposed_children: dict[int, object] = {}  # position -> labelled series (``labels`` costs a lock)
        self._accepted_children: dict[int, object] = {}
        self.speculation_length = Histogram(
            "speculation_length_tokens", "Speculation length k chosen per request per step (0 = plain decoding).",
            namespace=ns, registry=reg, buckets=SPEC_K_BUCKETS,
        )  # fmt: skip
        self.step_speculation_length = Gauge(
            "step_speculation_length_tokens", "Mean k over the requests of the last step.", namespace=ns, registry=reg
        )
        self.draft_memory_events_total = Counter(
            "draft_memory_events_total", "Draft weight offloads and reloads (Nightjar elastic memory).",
            ["event"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.draft_offloaded = Gauge(
            "draft_offloaded", "1 while the draft's weights are offloaded to host memory.", namespace=ns, registry=reg
        )
        self.kv_pool_events_total = Counter(
            "kv_pool_events_total", "Target KV pool resizes around draft offloads: grow, shrink, grow-failed, "
            "shrink-refused (Nightjar elastic memory).", ["event"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.admission_events_total = Counter(
            "admission_events_total", "Queue-policy preemptions, resumptions with the KV kept, and evictions (the KV "
            "released: the request is prefilled again when readmitted).", ["event"], namespace=ns, registry=reg,
        )  # fmt: skip
        self.kv_token_budget = Gauge(
            "kv_budget_tokens", "The scheduler's KV token budget (max_tokens_in_flight), grown while the draft is "
            "offloaded.", namespace=ns, registry=reg,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "queue_depth", "Requests waiting for admission.", ["queue"], namespace=ns, registry=reg
        )
        self.prefill_chunks_total = Counter(
            "prefill_chunks_total", "Chunks of chunked prefills run (each in one target step beside the verifies).",
            namespace=ns, registry=reg,
        )  # fmt: skip
        self.prefix_cache_hit_tokens_total = Counter(
            "prefix_cache_hit_tokens_total", "Prompt tokens of chunked prefills the target's prefix cache served.",
            namespace=ns, registry=reg,
        )  # fmt: skip
        self._queue_depth_children: dict[str, Gauge] = {}
        self._draft_state: tuple[bool, int] = (False, 0)  # (offloaded, KV token budget) last set (gauges start at 0)
        self.running_requests = Gauge("running_requests", "Requests holding KV cache.", namespace=ns, registry=reg)
        self.grammar_seconds_total = Counter(
            "grammar_seconds_total", "Host time the model services spent on structured-output grammars (matcher "
            "walks and masks for drafted and verified rows).", ["service"], namespace=ns, registry=reg,
        )  # fmt: skip

    # --- recording helpers --------------------------------------------------------------------

    def observe_request(
        self,
        *,
        ttft_s: float | None,
        tpot_s: float | None,
        num_tokens: int,
        finish_reason: str = "length",
        slo_tpot_ms: float | None = None,
        slo_ttft_ms: float | None = None,
        slo_class: str = "default",
    ) -> bool:
        """Record a finished request; returns whether it met its SLO."""
        if ttft_s is not None:
            self.ttft_seconds.labels(slo_class).observe(ttft_s)
        if tpot_s is not None:
            self.tpot_seconds.labels(slo_class).observe(tpot_s)
        attained = finish_reason not in ("error", "aborted")
        if slo_tpot_ms and tpot_s is not None:
            attained = attained and tpot_s * 1000.0 <= slo_tpot_ms
        if slo_ttft_ms and ttft_s is not None:
            attained = attained and ttft_s * 1000.0 <= slo_ttft_ms
        self.requests_total.labels(finish_reason).inc()
        self.slo_requests_total.labels(slo_class, "attained" if attained else "violated").inc()
        self.generated_tokens_total.inc(num_tokens)
        if attained:
            self.goodput_tokens_total.labels(slo_class).inc(num_tokens)
        return attained

    def observe_step(
        self,
        *,
        num_proposed: int,
        num_accepted: int,
        depth: int | None = None,
        num_pruned: int = 0,
    ) -> None:
        """Record one request's verification step (``depth`` defaults to num_proposed: a chain)."""
        self.observe_steps([(num_proposed, num_accepted, num_proposed if depth is None else depth, num_pruned)])

    def observe_steps(self, steps: Sequence[tuple[int, int, int, int]]) -> None:
        """Many requests' verification steps, each ``(num_proposed, num_accepted, depth, num_pruned)``, at the
        cost of one update per series: a batch of 64 is 64 additions, not 64 x (4 + 2 x depth) counter locks."""
        tally = StepTally(self.max_positions)
        tally.add_steps(steps)
        self.apply(tally)

    def apply(self, tally: "StepTally") -> None:
        """Steps summed in a StepTally: one update per series."""
        if tally.proposed:
            self.draft_tokens_proposed_total.inc(tally.proposed)
        if tally.accepted:
            self.draft_tokens_accepted_total.inc(tally.accepted)
        if tally.pruned:
            self.draft_tokens_pruned_total.inc(tally.pruned)
        for length, n in tally.lengths.items():
            observe_n(self.accepted_length, length, n)
        for counts, children in ((tally.depths, self._proposed_at), (tally.reached, self._accepted_at)):
            at_least = 0  # steps that reached this position: those whose depth (or accepted length) exceeds it
            for position in range(max(counts, default=0) - 1, -1, -1):
                at_least += counts.get(position + 1, 0)
                if at_least:
                    children(position).inc(at_least)
        for k, n in tally.ks.items():
            observe_n(self.speculation_length, k, n)
        if tally.last_mean_k is not None:
            self.step_speculation_length.set(tally.last_mean_k)
        self.observe_admission(preempted=tally.preempted, resumed=tally.resumed, evicted=tally.evicted)

    def _proposed_at(self, position: int):
        return self._position_child(self.position_proposed_total, self._proposed_children, position)

    def _accepted_at(self, position: int):
        return self._position_child(self.position_accepted_total, self._accepted_children, position)

    @staticmethod
    def _position_child(counter: Counter, cache: dict[int, object], position: int):
        child = cache.get(position)
        if child is None:  # made at first use: a depth never reached shows no series
            child = cache[position] = counter.labels(str(position))
        return child

    def observe_prefill(self, *, chunks: int, cached_tokens: int) -> None:
        """Chunked prefill since the last step: chunks run, prompt tokens the prefix cache served."""
        if chunks:
            self.prefill_chunks_total.inc(chunks)
        if cached_tokens:
            self.prefix_cache_hit_tokens_total.inc(cached_tokens)

    def observe_plain_steps(self, n: int) -> None:
        """``n`` requests' verification steps without a draft: each accepted length 1, nothing proposed."""
        if n:
            observe_n(self.accepted_length, 1, n)

    def observe_speculation(self, ks: list[int]) -> None:
        """The k chosen for every request of one step."""
        tally = StepTally(self.max_positions)
        tally.add_speculation(ks)
        self.apply(tally)

    def observe_feature_bytes(self, *, received: int, sent: int, pushed: int = 0) -> None:
        if pushed:
            self.feature_bytes_total.labels("target_to_draft").inc(pushed)
        if received:
            self.feature_bytes_total.labels("target_to_scheduler").inc(received)
        if sent:
            self.feature_bytes_total.labels("scheduler_to_draft").inc(sent)

    def observe_relay(self, **counts: int) -> None:
        """Draft relay events since the last step, by event (handed_off, dropped, missed, verify_ahead, lookahead)."""
        children = self.__dict__.setdefault("_relay_children", {})  # looked up once (``labels``: a lock and a dict)
        for event, n in counts.items():
            if n:
                child = children.get(event)
                if child is None:
                    child = children[event] = self.draft_relay_total.labels(event)
                child.inc(n)

    def observe_draft_memory(
        self, *, event: str | None, offloaded: bool, pool_event: str | None = None, kv_token_budget: int | None = None
    ) -> None:
        """One step's draft memory state; ``event`` is "offload" or "reload", ``pool_event`` a KV pool resize."""
        if event is not None:
            self.draft_memory_events_total.labels(event).inc()
        if pool_event is not None:
            self.kv_pool_events_total.labels(pool_event).inc()
        state = (offloaded, kv_token_budget or self._draft_state[1])
        if state != self._draft_state:  # set on change: a gauge's ``set`` takes a lock, every step
            self._draft_state = state
            self.draft_offloaded.set(1.0 if offloaded else 0.0)
            if state[1]:
                self.kv_token_budget.set(state[1])

    def observe_admission(self, *, preempted: int = 0, resumed: int = 0, evicted: int = 0) -> None:
        """One step's preemptions, resumptions and evictions (scheduler/admission.py)."""
        for event, n in (("preempt", preempted), ("resume", resumed), ("evict", evicted)):
            if n:
                self.admission_events_total.labels(event).inc(n)

    def set_load(self, *, waiting: int, running: int, queue: str = "all") -> None:
        child = self._queue_depth_children.get(queue)
        if child is None:  # ``labels`` costs a lock and a tuple: looked up once per queue
            child = self._queue_depth_children[queue] = self.queue_depth.labels(queue)
        child.set(waiting)
        self.running_requests.set(running)

    def read_load(self, waiting: Callable[[], float], running: Callable[[], float], queue: str = "all") -> None:
        """The queue depth and running requests read from these functions when scraped, instead of set: the
        scheduler's load changes every step, and nobody reads it between scrapes."""
        self.queue_depth.labels(queue).set_function(waiting)
        self.running_requests.set_function(running)

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format, for a /metrics route of another server."""
        return prometheus_client.generate_latest(self.registry), prometheus_client.CONTENT_TYPE_LATEST

    def render(self) -> str:
        """The text exposition format (what /metrics serves)."""
        return prometheus_client.generate_latest(self.registry).decode()


def start_http_server(
    port: int, registry: CollectorRegistry, addr: str = "127.0.0.1"
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on http://addr:port/metrics in a daemon thread; ``server.shutdown()`` stops it.

    Port 0 picks a free port: read it from ``server.server_port``.
    """
    return prometheus_client.start_http_server(port, addr=addr, registry=registry)
