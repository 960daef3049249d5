"""Per-step metrics summed and flushed in batches (shared/metric_flush.py): a scrape sees every step up to it,
whatever thread it comes from, and the counts are the ones per-step updates gave."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry

from scheduler.report import RequestOutcome, StepReport
from scheduler.spec_shape import SpecShape
from services.scheduler.observers.metrics import MetricsObserver
from services.scheduler.observers.vllm_metrics import VllmMetricsObserver
from shared.metric_flush import FlushingRegistry, StepBatch
from shared.metrics import TandemMetrics


class _Scheduler:
    """What the observers read of a scheduler besides the report."""

    features = relay = verify_ahead = target = draft = None
    waiting: list = []
    running: list = []
    max_tokens_in_flight = 0

    class chunks:
        num_chunks = num_cached_tokens = 0


def _report(step: int) -> StepReport:
    """A step of three requests: a chain of 4 with 3 accepted, a 6-node tree of depth 3 with 1, a plain decode."""
    chain, tree = SpecShape(kind="chain", k=4), SpecShape(kind="tree", k=6, depth=3, width=2)
    return StepReport(step=step, started_at=0.0, batch_size=3, outcomes=[
        RequestOutcome("a", chain, num_drafted=4, num_accepted=3, num_emitted=4),
        RequestOutcome("b", tree, num_drafted=6, num_accepted=1, num_emitted=2),
        RequestOutcome("c", SpecShape.none(), num_drafted=0, num_accepted=0, num_emitted=1)])  # fmt: skip


def _observed(registry_factory, steps: int, scrape_every: int = 0) -> dict[str, float]:
    metrics = TandemMetrics(registry=registry_factory())
    sched = _Scheduler()
    observers = (MetricsObserver(metrics, sched), VllmMetricsObserver(metrics.registry, sched, "toy"))
    for step in range(steps):
        for obs in observers:
            obs.on_step(_report(step))
        if scrape_every and step % scrape_every == 0:
            metrics.render()
    return _values(metrics)


def _values(metrics: TandemMetrics) -> dict[str, float]:
    values = {}
    for line in metrics.render().splitlines():
        if line and not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def test_a_scrape_sees_every_step_and_the_same_counts_as_updates_per_step():
    per_step = _observed(CollectorRegistry, 50)  # a plain registry cannot be hooked: every step flushes
    batched = _observed(FlushingRegistry, 50)
    scraped_meanwhile = _observed(FlushingRegistry, 50, scrape_every=7)
    assert per_step == batched == scraped_meanwhile
    assert batched["tandem_draft_tokens_proposed_total"] == 50 * 10
    assert batched['tandem_position_accepted_total{position="0"}'] == 50 * 2
    assert batched['vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="toy",position="2"}'] == 50
    assert batched['vllm:generation_tokens_total{model_name="toy"}'] == 50 * 7
    assert batched["tandem_accepted_length_tokens_count"] == 50 * 3


def test_the_counts_of_a_step_wait_at_most_a_period_in_the_observer():
    flushed = []
    batch = StepBatch(FlushingRegistry(), lambda: flushed.append(1), period_s=0.05)
    assert not batch.due()
    time.sleep(0.06)
    assert batch.due() and not batch.due()
    assert StepBatch(CollectorRegistry(), lambda: None, period_s=10.0).due()  # unhookable: due every step


def test_a_scrape_from_another_thread_loses_no_step():
    metrics = TandemMetrics()
    sched = _Scheduler()
    observers = (MetricsObserver(metrics, sched), VllmMetricsObserver(metrics.registry, sched, "toy"))
    done = threading.Event()

    def scrape():
        while not done.is_set():
            metrics.render()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for step in range(3000):
            for obs in observers:
                obs.on_step(_report(step))
    finally:
        done.set()
        scraper.join()
    values = _values(metrics)
    assert values["tandem_draft_tokens_proposed_total"] == 3000 * 10
    assert values['vllm:spec_decode_num_drafts_total{model_name="toy"}'] == 3000 * 2
    assert values['tandem_position_proposed_total{position="3"}'] == 3000  # the chain's 4th
