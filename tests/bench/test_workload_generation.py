"""Workload generation: rates, proportions, determinism by seed."""

import statistics

import pytest

from bench import arrivals, prompts, slo, workload


def test_poisson_rate_and_exponential_gaps():
    times = arrivals.poisson(rate=5.0, n=4000, seed=1)
    assert times == sorted(times)
    gaps = [b - a for a, b in zip([0.0, *times], times)]
    assert statistics.mean(gaps) == pytest.approx(1 / 5.0, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 5.0, rel=0.08)  # exponential: sd == mean
    assert len(times) / times[-1] == pytest.approx(5.0, rel=0.05)


def test_on_off_bursts_swing_by_the_rate_ratio():
    times = arrivals.on_off(rate_on=20.0, rate_off=1.0, period_s=10.0, duty=0.3, n=3000, seed=2)
    on = sum((t % 10.0) < 3.0 for t in times)
    off = len(times) - on
    span = times[-1]
    on_rate = on / (span * 0.3)
    off_rate = off / (span * 0.7)
    assert on_rate == pytest.approx(20.0, rel=0.1)
    assert off_rate == pytest.approx(1.0, rel=0.25)
    assert on_rate / off_rate > 10


def test_recorded_shape_follows_the_shape_with_the_requested_mean():
    shape = arrivals.BURSTY_SHAPE
    assert max(shape) / min(shape) >= 10
    times = arrivals.recorded_shape(shape, mean_rate=4.0, n=6000, seed=3)
    assert len(times) / times[-1] == pytest.approx(4.0, rel=0.07)
    per_second = [0] * len(shape)
    for t in times:
        per_second[int(t) % len(shape)] += 1
    peak, quiet = shape.index(max(shape)), shape.index(min(shape))
    assert per_second[peak] / per_second[quiet] > 8


def test_same_seed_same_arrivals_other_seed_different():
    assert arrivals.poisson(3.0, 50, seed=7) == arrivals.poisson(3.0, 50, seed=7)
    assert arrivals.poisson(3.0, 50, seed=7) != arrivals.poisson(3.0, 50, seed=8)


@pytest.mark.parametrize("bad", [dict(rate=0, n=3), dict(rate=-1, n=3)])
def test_bad_rates_are_refused(bad):
    with pytest.raises(ValueError):
        arrivals.poisson(**bad)
    with pytest.raises(ValueError):
        arrivals.ClosedLoop(0)


def test_slo_classes_scale_with_the_baseline_like_adaserve_table_2():
    assert slo.STRINGENT.tpot_ms(12.5) == 12.5
    assert slo.MODERATE.tpot_ms(12.5) == pytest.approx(30.0)
    assert slo.RELAXED.tpot_ms(12.5) == pytest.approx(100.0)


def test_slo_mix_proportions():
    classes = slo.assign_classes(5000, slo.ADASERVE_MIX, seed=4)
    share = {name: sum(c.name == name for c in classes) / len(classes) for name in slo.CLASSES}
    for name, p in slo.ADASERVE_MIX.items():
        assert share[name] == pytest.approx(p, abs=0.025)
    with pytest.raises(ValueError):
        slo.assign_classes(3, {"urgent": 1.0})


def test_prompt_sets_are_offline_and_deterministic():
    for kind in prompts.KINDS:
        a = prompts.load(kind, 5, seed=1)
        assert a == prompts.load(kind, 5, seed=1)
        assert all(p.kind == kind and p.text for p in a)
    assert "Summarise" in prompts.load("summarize", 1)[0].text
    assert "```python" in prompts.load("code", 1)[0].text


def test_workload_is_deterministic_and_follows_the_mixes():
    times = arrivals.poisson(2.0, 300, seed=5)
    kw = dict(arrivals=times, prompt_mix={"chat": 0.5, "code": 0.5}, slo_mix=slo.ADASERVE_MIX, max_new_tokens=(8, 32))
    items = workload.build(300, seed=5, **kw)
    assert items == workload.build(300, seed=5, **kw)
    assert [it.arrival_s for it in items] == times
    assert all(8 <= it.max_new_tokens <= 32 for it in items)
    code_share = sum(it.prompt.kind == "code" for it in items) / len(items)
    assert code_share == pytest.approx(0.5, abs=0.08)
    with pytest.raises(ValueError):
        workload.build(3, seed=0, **kw)  # 300 arrival times for 3 requests


def test_log_uniform_bounds_are_heavy_tailed_within_the_range():
    items = workload.build(3000, arrivals=None, prompt_mix={"chat": 1.0}, slo_mix={"relaxed": 1.0},
                           max_new_tokens=(8, 256), seed=3, length_dist="log-uniform")  # fmt: skip
    bounds = [i.max_new_tokens for i in items]
    assert min(bounds) >= 8 and max(bounds) <= 256
    short, long_ = sum(b < 16 for b in bounds) / len(bounds), sum(b >= 128 for b in bounds) / len(bounds)
    assert short == pytest.approx(0.2, abs=0.03) and long_ == pytest.approx(0.2, abs=0.03)  # a fifth per octave
    assert statistics.median(bounds) < 60  # uniform would put it at 132
    with pytest.raises(ValueError):
        workload.build(2, arrivals=None, prompt_mix={"chat": 1.0}, slo_mix={"relaxed": 1.0}, max_new_tokens=(8, 9),
                       length_dist="zipf")  # fmt: skip
