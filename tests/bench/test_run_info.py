"""bench.run_info.ensure_profiles: what `make bench-slo` and friends run before a preset, from the harness."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench import run_info
from bench.stack import Models


def _fake_run(answers):
    calls = []

    def run(cmd, **kwargs):
        calls.append(cmd)
        code, text = answers[len(calls) - 1]
        return subprocess.CompletedProcess(cmd, code, stdout=text, stderr="boom" if code else "")

    return calls, run


def test_profiles_the_pairs_target_and_draft_when_missing(monkeypatch):
    calls, run = _fake_run([(0, "profiling smollm2 ...\nB = 64 tokens (ridge; T(1) = 56.3 ms, T(B) = 105.9 ms)\nstored"),
                            (0, "smollm2-eagle3 is a feature-level draft (EAGLE head over the target's features);\nit "
                                "is not profiled alone: the speculation policies fit its cost online")])  # fmt: skip
    monkeypatch.setattr(run_info.subprocess, "run", run)
    notes = run_info.ensure_profiles(Models(pair="eagle", dtype="bfloat16"), log=lambda _: None)
    assert [c[c.index("profile"):] for c in calls] == [
        ["profile", "--device", "cpu", "--dtype", "bfloat16", "--if-missing", "--pair", "eagle"],
        ["profile", "--device", "cpu", "--dtype", "bfloat16", "--if-missing", "--pair", "eagle", "--draft"]]
    assert notes == ["profiled the target first (none on this machine): B = 64 tokens (ridge; T(1) = 56.3 ms, "
                     "T(B) = 105.9 ms) stored"]


def test_an_explicit_target_is_profiled_alone_and_a_failure_is_a_note(monkeypatch):
    calls, run = _fake_run([(1, "")])
    monkeypatch.setattr(run_info.subprocess, "run", run)
    notes = run_info.ensure_profiles(Models(target=Path("/m/t"), draft=Path("/m/d"), home=Path("/h")), log=lambda _: None)
    assert len(calls) == 1 and calls[0][-4:] == ["--model", "/m/t", "--home", "/h"]
    assert notes and "failed (exit 1)" in notes[0] and "boom" in notes[0]


def test_a_split_stack_is_profiled_at_its_thread_count_too(monkeypatch):
    """FASER's stacks run each model on a share of the cores; the scheduler prefers a profile at that count."""
    calls, run = _fake_run([(0, "already profiled")] * 4)
    monkeypatch.setattr(run_info.subprocess, "run", run)
    run_info.ensure_profiles(Models(pair="eagle", dtype="bfloat16"), log=lambda _: None, threads=(None, 1))
    assert [c[c.index("--pair"):] for c in calls] == [
        ["--pair", "eagle"], ["--pair", "eagle", "--draft"],
        ["--pair", "eagle", "--threads", "1"], ["--pair", "eagle", "--draft", "--threads", "1"]]


def test_the_recorded_budget_reads_the_profile_at_the_target_services_thread_count(tmp_path, monkeypatch):
    """results.json's token_budget is what the scheduler finds: a 2-thread stack must not report the newer
    1-thread profile a FASER run left behind (the scheduler, told 2 threads by the target, reads the 2-thread one)."""
    import asyncio
    import time

    from shared.profiling import sm_share
    from shared.profiling.cost_model import CostModel, Knee, Profile, save_profile

    def profile(budget, threads):
        knee = Knee(budget=budget, method="ridge", slope_before_s=1e-3, slope_after_s=1e-3, latency_at_budget_s=0.05,
                    latency_at_one_s=0.026)  # fmt: skip
        return Profile(model="tiny-target", hardware=f"cpu test ({threads} threads)", device="cpu", dtype="float32",
                       token_budget=budget, knee=knee, cost_model=CostModel(alpha_s=1e-6, gamma_s=1e-3, delta_s=0.025),
                       sweep=[(1, 0.026), (budget, 0.05)], settings={"threads": threads})  # fmt: skip

    save_profile(profile(64, 2), tmp_path)
    time.sleep(0.02)
    save_profile(profile(32, 1), tmp_path)  # the newest
    monkeypatch.setattr(sm_share, "available_cores", lambda: 2)
    models = Models(target=tmp_path / "tiny-target", draft=tmp_path / "d", home=tmp_path, device="cpu", dtype="float32")
    plain, faser = ["tandem-k3"], ["faser:serial", "faser:pipe"]
    assert run_info.target_threads(models, plain) == 2 and run_info.target_threads(models, faser) == 1
    assert run_info.faser_split(models, plain) is None and run_info.faser_split(models, faser) == (1, 1)
    budget = lambda configs: asyncio.run(run_info.token_budget(models, models.target, run_info.target_threads(models, configs)))  # noqa: E731
    assert budget(plain)["value"] == 64 and budget(faser)["value"] == 32
    gpu = Models(target=tmp_path / "tiny-target", draft=tmp_path / "d", home=tmp_path, device="cuda", dtype="float32")
    assert run_info.target_threads(gpu, faser) == 0 and run_info.faser_split(gpu, faser) is None
