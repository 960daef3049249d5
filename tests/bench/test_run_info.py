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
