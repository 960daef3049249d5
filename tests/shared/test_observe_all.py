"""Many values into a histogram at once (shared/metrics.py ``observe_all``): the same series as ``observe`` each."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from shared.metrics import TPOT_BUCKETS, observe_all


def _samples(registry: CollectorRegistry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples
            if not s.name.endswith("_created")}  # fmt: skip


@pytest.mark.parametrize("values", [[], [0.0], [0.002, 0.0021, 0.5, 7.0, 0.03, 0.03, 1e9], [0.01] * 50])
def test_observe_all_reads_as_observing_each_value(values):
    one, many = CollectorRegistry(), CollectorRegistry()
    h1 = Histogram("itl", "x", ["model"], registry=one, buckets=TPOT_BUCKETS).labels("m")
    h2 = Histogram("itl", "x", ["model"], registry=many, buckets=TPOT_BUCKETS).labels("m")
    for v in values:
        h1.observe(v)
    observe_all(h2, values)
    a, b = _samples(one), _samples(many)
    assert a.keys() == b.keys()
    for key in a:
        assert b[key] == pytest.approx(a[key]), key  # bucket counts exact, the sum up to rounding


def test_observe_all_without_the_internals_falls_back_to_observe():
    seen = []

    class Plain:
        def observe(self, amount):
            seen.append(amount)

    observe_all(Plain(), [0.1, 0.2])
    assert seen == [0.1, 0.2]
