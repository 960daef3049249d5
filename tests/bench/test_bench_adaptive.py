"""`make bench-adaptive` in miniature on the tiny pair: fixed k against SmartSpec and FASER, a rate and a burst."""

from __future__ import annotations

import pytest

from bench.harness import ADAPTIVE_SWEEP, adaptive_options, run_bench
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


def test_adaptive_preset():
    opts = adaptive_options(sweep_requests=3)
    assert opts.sweep[: len(ADAPTIVE_SWEEP)] == list(ADAPTIVE_SWEEP) and opts.bursty and opts.batch1 == []
    assert opts.rate_factors == sorted(opts.rate_factors) and len(opts.rate_factors) >= 4  # low -> high load
    assert opts.interleave  # every stack up at once, configurations alternating: drift falls on all alike


CONFIGS = ["target-only", "tandem-k3", "policy:smartspec", "policy:faser"]


@pytest.mark.timeout(240)
def test_tiny_bench_adaptive_runs_sweep_and_bursty(tmp_path):
    target, draft = save_tiny_pair(tmp_path / "models")
    opts = adaptive_options(
        models=Models(target=target, draft=draft, home=tmp_path),
        sweep=CONFIGS, sweep_requests=3, sweep_max_new_tokens=6, rates=[40.0], max_prompt_tokens=48,
        sweep_repeats=2,
    )  # fmt: skip
    res = run_bench(opts, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == ["stack0", "stack1", "stack2"]
    (burst,) = res["bursty"]
    for phase, load in [("sweep", next(iter(res["sweep"]))), ("bursty", burst)]:
        rows = res[phase][load]
        assert set(rows) == set(CONFIGS), (phase, load)
        for name, row in rows.items():
            s = row["summary"]
            assert s["num_ok"] == s["num_requests"] == 6, (phase, load, name, s["errors"])  # 2 repeats x 3
            # each configuration's spans came from its own stack, with the phase split
            assert row["overhead"]["num_steps"] > 0 and row["overhead"]["phase_s"]["verify"] > 0, (phase, name)
