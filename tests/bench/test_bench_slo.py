"""`make bench-slo` in miniature on the tiny pair: rate sweep and stringent-share phases, side by side.

Every service stack costs seconds to launch on a busy 2-core machine, so the run
here keeps two stacks (the shared one for target-only and tandem-k3, and AdaServe's);
tests/e2e/test_tree_policies.py serves every tree policy, GlobalGreedy and EqualGreedy too.
"""

from __future__ import annotations

import json

import pytest

from bench.harness import SLO_SWEEP, run_bench, share_mix, slo_options
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


def test_share_mix_splits_the_rest_evenly():
    assert share_mix(0.6) == pytest.approx({"stringent": 0.6, "moderate": 0.2, "relaxed": 0.2})
    assert share_mix(1.0) == {"stringent": 1.0, "moderate": 0.0, "relaxed": 0.0}
    with pytest.raises(ValueError):
        share_mix(1.5)


def test_slo_preset_is_adaserves_comparison():
    opts = slo_options(sweep_requests=3)
    assert opts.sweep == list(SLO_SWEEP) and opts.batch1 == []
    assert opts.slo_mix == {"stringent": 0.6, "moderate": 0.2, "relaxed": 0.2}
    assert opts.stringent_shares and opts.sweep_requests == 3


CONFIGS = ["target-only", "tandem-k3", "policy:adaserve"]


@pytest.mark.timeout(240)
def test_tiny_bench_slo_runs_side_by_side_over_rates_and_shares(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_TOKEN_BUDGET", "8")  # what the launched schedulers and the results see
    target, draft = save_tiny_pair(tmp_path / "models")
    opts = slo_options(
        models=Models(target=target, draft=draft, home=tmp_path),
        sweep=CONFIGS,
        sweep_requests=3,
        sweep_max_new_tokens=6,
        rates=[40.0],
        stringent_shares=[0.2, 1.0],
        share_rate=40.0,
        max_prompt_tokens=48,
        traces=False,
    )
    out = tmp_path / "out"
    res = run_bench(opts, out)

    assert sorted(p.name for p in (out / "logs").iterdir()) == ["stack0", "stack1"]
    assert res["token_budget"] == {"value": 8, "source": "setting"}
    (rate,) = res["sweep"]
    assert list(res["mix"]) == ["stringent=0.2", "stringent=1"]
    for phase, load in [("sweep", rate), ("mix", "stringent=0.2"), ("mix", "stringent=1")]:
        rows = res[phase][load]
        assert set(rows) == set(CONFIGS), (phase, load)
        for name, row in rows.items():
            s = row["summary"]
            assert s["num_ok"] == s["num_requests"] == 3, (phase, load, name, s["errors"])
            assert 0.0 <= s["attainment"] <= 1.0
    # every request of the all-stringent mix is stringent
    assert set(res["mix"]["stringent=1"]["policy:adaserve"]["summary"]["attainment_by_class"]) == {"stringent"}
    saved = json.loads((out / "results.json").read_text())
    assert saved["workload"]["mix"]["stringent_shares"] == [0.2, 1.0]
    for png in ("load_sweep.png", "load_mix.png"):
        assert (out / png).stat().st_size > 1000


def test_slo_flag_presets_what_the_command_line_does_not_give(monkeypatch):
    from typer.testing import CliRunner

    import bench.harness as harness
    import bench.harness_cli as harness_cli

    got = []
    monkeypatch.setattr(harness, "run_bench", got.append)
    args = ["--slo", "--pair", "tiny", "--name", "slo-tiny", "--sweep-requests", "5", "--stringent-shares", "0.5"]
    result = CliRunner().invoke(harness_cli.app, args)
    assert result.exit_code == 0, result.output
    (opts,) = got
    assert (opts.name, opts.sweep_requests, opts.stringent_shares) == ("slo-tiny", 5, [0.5])  # given: kept
    assert opts.sweep == list(SLO_SWEEP) and opts.batch1 == [] and opts.slo_mix == share_mix(0.6)  # preset
    assert opts.models.pair == "tiny"
