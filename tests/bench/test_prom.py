"""Prometheus scrapes: differences between two scrapes and per-position acceptance."""

import pytest

from bench.prom import parse, per_position_acceptance, scrape

TEXT = """
# TYPE tandem_position_proposed_total counter
tandem_position_proposed_total{{position="0"}} {p0}
tandem_position_proposed_total{{position="1"}} {p1}
# TYPE tandem_position_accepted_total counter
tandem_position_accepted_total{{position="0"}} {a0}
tandem_position_accepted_total{{position="1"}} {a1}
"""


def test_difference_and_per_position_rates():
    before = parse(TEXT.format(p0=10, p1=10, a0=5, a1=2))
    after = parse(TEXT.format(p0=30, p1=30, a0=20, a1=11))
    rows = per_position_acceptance(after - before)
    assert [r["position"] for r in rows] == [0, 1]
    assert rows[0]["proposed"] == 20 and rows[0]["rate"] == pytest.approx(15 / 20)
    assert rows[1]["rate"] == pytest.approx(9 / 20)
    assert rows[1]["conditional_rate"] == pytest.approx(9 / 15)  # given position 0 accepted


def test_no_url_means_no_scrape():
    assert scrape(None) == {} and per_position_acceptance(parse("")) == []


def test_early_exit_share_from_the_schedulers_counters():
    from bench.prom import early_exit
    from shared.metrics import TandemMetrics

    m = TandemMetrics()
    before = parse(m.render())
    m.observe_step(num_proposed=8, num_accepted=2, num_pruned=3)
    m.observe_step(num_proposed=4, num_accepted=4)
    ee = early_exit(parse(m.render()) - before)
    assert ee == {"proposed": 12, "pruned": 3, "pruned_share": pytest.approx(3 / 12)}
    assert early_exit(parse("")) is None


def test_speculation_lengths_per_k_from_the_histogram():
    from bench.prom import speculation_lengths
    from shared.metrics import TandemMetrics

    m = TandemMetrics()
    m.observe_speculation([0, 2, 2])
    before = parse(m.render())
    m.observe_speculation([1, 2, 2, 0, 7])
    assert speculation_lengths(parse(m.render()) - before) == {0: 1, 1: 1, 2: 2, 7: 1}


def test_admission_events_from_the_schedulers_counters():
    from bench.prom import admission_events
    from shared.metrics import TandemMetrics

    m = TandemMetrics()
    before = parse(m.render())
    m.observe_admission(preempted=3, resumed=2)
    m.observe_admission(preempted=1, evicted=1)
    assert admission_events(parse(m.render()) - before) == {"preempt": 4, "resume": 2, "evict": 1}
