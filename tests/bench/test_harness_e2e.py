"""The harness end to end on a tiny random pair: real launcher, services, SDK, HF peers, spans, plots."""

from __future__ import annotations

import json

import pytest

from bench.harness import BenchOptions, run_bench
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target, draft = save_tiny_pair(root / "models")
    opts = BenchOptions(
        name="e2e",
        models=Models(target=target, draft=draft),
        batch1=["target-only", "tandem-k2", "hf-target", "hf-assisted"],
        sweep=["target-only", "tandem-k2"],
        num_prompts=2,
        max_new_tokens=8,
        sweep_requests=3,
        sweep_max_new_tokens=6,
        rates=[30.0],
        concurrency=[2],
        max_prompt_tokens=48,
    )
    out = root / "out"
    return run_bench(opts, out), out


def test_every_configuration_is_measured_and_lossless(results):
    res, _ = results
    b1 = res["batch1"]
    assert list(b1) == ["target-only", "tandem-k2", "hf-target", "hf-assisted"]
    for name, row in b1.items():
        s = row["summary"]
        assert s["num_ok"] == s["num_requests"] == 2, (name, s["errors"])
        assert s["throughput_tok_s"] > 0 and s["tpot_s"]["p50"] > 0
        if name != "target-only":
            # greedy: every configuration reproduces the target's tokens
            assert row["lossless_vs_target_only"] == {"equal": 2, "compared": 2}
            assert row["speedup_vs_target_only"] > 0 and row["paired_speedup_vs_target_only"] > 0
    assert res["baseline_tpot_ms"] > 0
    k2 = b1["tandem-k2"]
    assert k2["summary"]["acceptance_rate"] is not None
    assert [p["position"] for p in k2["per_position_acceptance"]] == [0, 1]
    assert sum(k2["summary"]["accepted_per_step_hist"].values()) > 0


def test_overhead_breakdown_from_the_services_spans(results):
    res, _ = results
    for name in ("target-only", "tandem-k2"):
        ov = res["batch1"][name]["overhead"]
        assert ov is not None and ov["num_steps"] > 0
        assert 0.0 < ov["model_share"] < 1.0
        assert ov["overhead_share"] == pytest.approx(1.0 - ov["model_share"])
    assert res["batch1"]["hf-target"]["overhead"] is None  # in-process peers have no services


def test_load_phases_and_files(results):
    res, out = results
    (rate,) = res["sweep"]
    assert set(res["sweep"][rate]) == {"target-only", "tandem-k2"}
    assert res["sweep"][rate]["tandem-k2"]["summary"]["num_ok"] == 3
    assert set(res["closed"]["concurrency=2"]) == {"target-only", "tandem-k2"}
    for row in res["closed"]["concurrency=2"].values():  # each run's step times: the machine speed it met
        (run,) = row["by_run"]
        assert sum(shape["n"] for shape in run["step_ms_by_batch_k"].values()) > 0
    saved = json.loads((out / "results.json").read_text())
    assert saved["batch1"].keys() == res["batch1"].keys()
    for png in ("batch1_throughput.png", "load_sweep.png", "load_closed.png", "acceptance.png"):
        assert (out / png).stat().st_size > 1000


def test_a_finished_run_is_not_marked_partial(results):
    _, out = results
    assert "partial" not in json.loads((out / "results.json").read_text())


def test_a_run_without_a_target_profile_says_so(results):
    res, _ = results
    assert res["token_budget"]["source"] == "none"
    assert any("no target profile" in note for note in res["notes"])


def test_a_run_stopped_midway_keeps_what_it_measured(tmp_path, monkeypatch):
    """A GPU stage stopped at its budget (SIGINT), a crash an hour in: results.json holds every
    configuration measured before the stop, marked partial."""
    from bench.harness import Harness

    target, draft = save_tiny_pair(tmp_path / "models")
    opts = BenchOptions(name="stopped", models=Models(target=target, draft=draft), batch1=["target-only"],
                        sweep=["target-only", "tandem-k2"], num_prompts=1, max_new_tokens=6, sweep_requests=2,
                        sweep_max_new_tokens=4, rates=[30.0], bursty=True, max_prompt_tokens=48)  # fmt: skip

    async def stopped(self, *args, **kwargs):
        raise KeyboardInterrupt  # what the stage runner's SIGINT raises in the harness

    monkeypatch.setattr(Harness, "_bursty", stopped)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_bench(opts, out)
    saved = json.loads((out / "results.json").read_text())
    assert saved["partial"] is True
    assert saved["baseline_tpot_ms"] > 0
    assert saved["batch1"]["target-only"]["summary"]["num_ok"] == 1
    (rate,) = saved["sweep"]
    assert {name: row["summary"]["num_ok"] for name, row in saved["sweep"][rate].items()} == {
        "target-only": 2, "tandem-k2": 2}  # fmt: skip
    assert not list(out.glob("*.tmp"))
