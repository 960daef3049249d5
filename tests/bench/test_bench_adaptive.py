"""`make bench-adaptive` in miniature on the tiny pair: fixed k against SmartSpec and FASER, a rate and a burst.

The run is also `make bench-grounded`'s form of the preset (`--workload grounded --draft-model suffix:...`,
tests/bench/test_bench_workload_draft.py): grounded prompts, every stack drafting with the suffix tree. One run
for both keeps it to three stacks; the pair's own draft model serves the other bench runs here (harness_e2e,
slo, order, offload)."""

from __future__ import annotations

import pytest

from bench.harness import ADAPTIVE_SWEEP, adaptive_options, run_bench
from bench.options import WORKLOADS
from bench.prompts import GROUNDED
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


def test_adaptive_preset():
    opts = adaptive_options(sweep_requests=3)
    assert opts.sweep[: len(ADAPTIVE_SWEEP)] == list(ADAPTIVE_SWEEP) and opts.bursty and opts.batch1 == []
    assert opts.rate_factors == sorted(opts.rate_factors) and len(opts.rate_factors) >= 4  # low -> high load
    assert opts.interleave  # every stack up at once, configurations alternating: drift falls on all alike


CONFIGS = ["target-only", "tandem-k3", "policy:smartspec", "policy:faser"]


@pytest.mark.timeout(240)
def test_tiny_bench_adaptive_runs_sweep_and_bursty_on_grounded_prompts_with_the_suffix_draft(tmp_path):
    from tests.bench.test_bench_workload_draft import SUFFIX

    target, draft = save_tiny_pair(tmp_path / "models")
    opts = adaptive_options(
        models=Models(target=target, draft=draft, home=tmp_path),
        sweep=CONFIGS, sweep_requests=3, sweep_max_new_tokens=6, rates=[40.0], max_prompt_tokens=96,
        sweep_repeats=2, prompt_mix=dict(WORKLOADS["grounded"]), stack_draft=SUFFIX,
    )  # fmt: skip
    res = run_bench(opts, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "logs").iterdir()) == ["stack0", "stack1", "stack2"]
    assert res["models"]["draft"] == SUFFIX
    assert set(res["workload"]["sweep"]["prompt_mix"]) == set(GROUNDED)
    (burst,) = res["bursty"]
    for phase, load in [("sweep", next(iter(res["sweep"]))), ("bursty", burst)]:
        rows = res[phase][load]
        assert set(rows) == set(CONFIGS), (phase, load)
        for name, row in rows.items():
            s = row["summary"]
            assert s["num_ok"] == s["num_requests"] == 6, (phase, load, name, s["errors"])  # 2 repeats x 3
            # each configuration's spans came from its own stack, with the phase split
            assert row["overhead"]["num_steps"] > 0 and row["overhead"]["phase_s"]["verify"] > 0, (phase, name)
    for i in range(3):  # every stack's draft service is the suffix tree, not the pair's draft model
        assert "/models/draft" not in (tmp_path / "out" / "logs" / f"stack{i}" / "draft.log").read_text()
