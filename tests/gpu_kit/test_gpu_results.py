"""Result files of the GPU kit, fed synthetic data on a CPU: stage runner, summaries, highlights, pack/unpack.

The stage results are written by code that only runs on a GPU (bench/gpu/*.py); these tests pin
the shapes results.py reads, and read the committed CPU runs of bench-slo / bench-faser with the
same functions, so a change of the harness's results.json is caught here too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from bench.gpu import results
from bench.gpu.agreement import judge
from bench.gpu.budget import Stage, end_marked, marked_pids, run_stages

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable


# ----------------------------------------------------------------------------- stages against a deadline


def test_stages_ok_failed_timeout_and_skipped(tmp_path):
    write = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text('{}')"
    stages = [
        Stage("ok", [PY, "-c", write, str(tmp_path / "ok.json")], 20, 1, result="ok.json", budget_arg=False),
        Stage("fails", [PY, "-c", "import sys; print('boom'); sys.exit(3)"], 20, 1, budget_arg=False),
        Stage("no-result", [PY, "-c", "pass"], 20, 1, result="missing.json", budget_arg=False),
        Stage("slow", [PY, "-c", "import time; time.sleep(60)"], 1.5, 1, budget_arg=False),
        Stage("hungry", [PY, "-c", "pass"], 20, 10_000, budget_arg=False),
        Stage("budget", [PY, "-c", "import sys; assert sys.argv[1:] == ['--budget-s', '20']"], 20, 1),
    ]
    t = time.monotonic()
    records = run_stages(stages, deadline=time.monotonic() + 120, out_dir=tmp_path, env=dict(os.environ), cwd=REPO,
                         reserve_s=0, log=lambda _: None)  # fmt: skip
    status = {r.name: r.status for r in records}
    assert status == {"ok": "ok", "fails": "failed", "no-result": "failed", "slow": "timeout", "hungry": "skipped",
                      "budget": "ok"}  # fmt: skip
    assert "boom" in records[1].reason and "exit 3" in records[1].reason
    assert time.monotonic() - t < 30  # the slow one was interrupted, not waited for
    assert (tmp_path / "logs" / "fails.log").read_text().endswith("\nboom\n")  # the stage's output, in its log


def test_processes_a_stage_leaves_behind_are_ended(tmp_path):
    # a child in a session of its own (as the launcher starts the services) outlives the stage's process group
    orphan = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
              "start_new_session=True)")  # fmt: skip
    logs = []
    records = run_stages([Stage("orphan", [PY, "-c", orphan], 20, 1, budget_arg=False)],
                         deadline=time.monotonic() + 60, out_dir=tmp_path, env=dict(os.environ), cwd=REPO,
                         reserve_s=0, log=logs.append)  # fmt: skip
    assert records[0].status == "ok"
    assert any("ended 1 leftover" in line for line in logs), logs


def test_marked_pids_finds_only_its_mark(tmp_path):
    env = {**os.environ, "TANDEM_GPU_STAGE_ID": "mark-a"}
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while proc.pid not in marked_pids("mark-a") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.pid in marked_pids("mark-a")
        assert proc.pid not in marked_pids("mark-b")
        assert end_marked("mark-a") == 1
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()


# ----------------------------------------------------------------------------- summaries and highlights


def stage(name, status="ok", result=None, **kw):
    return {"name": name, "status": status, "elapsed_s": 1.0, "budget_s": 10.0, "reason": "", "result": result, **kw}


DEVICE = {"torch": "2.11.0+cu130", "cuda": "13.0", "flashinfer": "0.6.4",
          "gpu": {"name": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "multiprocessors": 132}}  # fmt: skip


def harness_run(attainment: dict[str, dict[str, float]], tpot: dict[str, float] | None = None) -> dict:
    """The part of the harness's results.json the highlights read."""
    def conf(a=None, t=None):
        summary = {"attainment": a} if a is not None else {}
        if t is not None:
            summary["tpot_s"] = {"mean": t, "p50": t, "p99": t}
        return {"summary": summary}

    return {"sweep": {load: {c: conf(a) for c, a in row.items()} for load, row in attainment.items()}, "mix": {},
            "batch1": {c: conf(t=t) for c, t in (tpot or {}).items()}}  # fmt: skip


def bench_work(tmp_path: Path) -> Path:
    work = tmp_path / "gpu-bench"
    (work / "faser").mkdir(parents=True)
    (work / "slo").mkdir()
    results.write_json(work / "verify_curve.json", {"curves": [
        {"model": "smollm2-135m-instruct", "backend": "flashinfer", "sweep": [[1, 0.004], [128, 0.0045], [256, 0.009]],
         "budget": 128, "method": "knee", "tB_ms": 4.5},
        {"model": "random-llama-8b", "backend": "sdpa", "sweep": [[256, 0.04], [1, 0.006]], "budget": 96,
         "method": "knee", "tB_ms": 9.0}]})  # fmt: skip
    results.write_json(work / "decode.json", {"rows": [
        {"backend": "flashinfer", "batch": 1, "tandem_tok_s": 150.0, "hf_tok_s": 100.0},
        {"backend": "sdpa", "batch": 64, "tandem_tok_s": 5000.0, "hf_tok_s": 4000.0}]})  # fmt: skip
    results.write_json(work / "sm_split.json", {"mps": {"available": True}, "green_contexts": {"available": False},
                                                "modes": [
        {"mode": "alone", "draft_ms": 2.0, "target_ms": 6.0},
        {"mode": "time-slicing", "draft_ms": 4.0, "target_ms": 9.0},
        {"mode": "mps-25/75", "draft_ms": 5.0, "target_ms": 7.0}]})  # fmt: skip
    base = {"target-only": 0.5, "tandem-k3": 0.6, "policy:specinfer": 0.2, "policy:equal_greedy": 0.4,
            "policy:global_greedy": 0.45}  # fmt: skip
    results.write_json(work / "slo" / "results.json", harness_run({
        "rate=2": {**base, "policy:adaserve": 0.9},  # best baseline 0.6 < 70 %: 0.9 >= 1.3 x 0.6
        "rate=4": {**{k: v / 2 for k, v in base.items()}, "policy:adaserve": 0.35},  # 0.35 < 1.3 x 0.3
        "rate=1": {**{k: 0.95 for k in base}, "policy:adaserve": 0.96}}))  # baselines >= 70 %: not judged
    results.write_json(work / "faser" / "results.json", harness_run({}, {"faser:serial": 0.010, "faser:pipe": 0.009,
                                                                         "faser:ee": 0.0095, "faser:all": 0.008}))  # fmt: skip
    return work


BENCH_STAGES = [stage("setup"), stage("device", result="device.json"), stage("verify_curve", result="verify_curve.json"),
                stage("decode", result="decode.json"), stage("faser", result="faser/results.json"),
                stage("sm_split", result="sm_split.json"), stage("slo", "skipped", result="slo/results.json")]  # fmt: skip


def test_highlights_from_every_stage(tmp_path):
    work = bench_work(tmp_path)
    stages = [dict(s, status="ok") for s in BENCH_STAGES]
    h = results.highlights(work, stages)
    curves = {(r["model"], r["backend"]): r for r in h["verify_curve"]}
    assert curves[("smollm2-135m-instruct", "flashinfer")]["B"] == 128
    assert curves[("random-llama-8b", "sdpa")] | {} == {"model": "random-llama-8b", "backend": "sdpa", "B": 96,
                                                      "method": "knee", "t1_ms": 6.0, "tB_ms": 9.0, "t_max_ms": 40.0,
                                                      "n_max": 256}  # fmt: skip
    assert [r["ratio"] for r in h["decode"]] == [1.5, 1.25]
    split = h["sm_split"]
    assert split["serial_ms"] == 8.0 and split["best"] == "mps-25/75"
    assert {r["mode"]: r.get("round_vs_serial") for r in split["modes"]} == {"alone": None, "time-slicing": 1.125,
                                                                            "mps-25/75": 0.875}  # fmt: skip
    slo = h["slo"]
    judged = {r["load"]: r["goal_met"] for r in slo["loads"] if "goal_met" in r}
    assert judged == {"rate=2": True, "rate=4": False} and slo["goal_met"] is False and slo["judged"] == 2
    assert h["faser"] == {"tpot_ms": {"faser:serial": 10.0, "faser:pipe": 9.0, "faser:ee": 9.5, "faser:all": 8.0},
                          "all_vs_serial": -0.2, "goal_met": True, "partial": False}  # fmt: skip
    assert slo["partial"] is False


def test_a_stage_stopped_at_its_budget_is_highlighted_as_partial(tmp_path):
    work = bench_work(tmp_path)
    data = json.loads((work / "faser" / "results.json").read_text())
    del data["batch1"]["faser:all"]  # the fourth variant's stack was still starting
    results.write_json(work / "faser" / "results.json", {**data, "partial": True})
    h = results.highlights(work, [stage("faser", "timeout", result="faser/results.json")])
    assert h["faser"]["partial"] is True and "goal_met" not in h["faser"]
    assert set(h["faser"]["tpot_ms"]) == {"faser:serial", "faser:pipe", "faser:ee"}


def test_a_malformed_stage_result_is_reported_not_raised(tmp_path):
    work = bench_work(tmp_path)
    results.write_json(work / "decode.json", {"rows": [{"backend": "sdpa"}]})
    h = results.highlights(work, [stage("decode", result="decode.json"), stage("faser", result="nope.json")])
    assert "KeyError" in h["decode"]["error"] and "faser" not in h


@pytest.mark.parametrize("name,reader", [("faser-demo", results.faser_highlights), ("slo-demo", results.slo_highlights)])
def test_committed_cpu_results_read_with_the_same_functions(name, reader):
    path = REPO / "bench" / "results" / name / "results.json"
    if not path.is_file():
        pytest.skip(f"{path} is not committed")
    out = reader(json.loads(path.read_text()))
    if name == "faser-demo":
        assert set(out["tpot_ms"]) == {"faser:serial", "faser:pipe", "faser:ee", "faser:all"} and "goal_met" in out
    else:
        assert out["loads"] and all("ours" in r for r in out["loads"])


def check_summary(**over) -> dict:
    s = {"run": "check", "version": results.SUMMARY_VERSION, "started_at": "2026-12-01T10:00:00+0000",
         "elapsed_s": 300.0, "device": DEVICE, "stages": [stage("setup"), stage("tests-gpu")],
         "tests": {"passed": 10, "failed": 1, "skipped": 0, "errors": 0, "failures": ["tests.gpu.x::test_y"]}}  # fmt: skip
    return s | over


def test_validate_summary():
    results.validate_summary(check_summary())
    for broken in ({"run": "nope"}, {"version": 0}, {"tests": {}}, {"stages": [{"name": "x", "status": "ok"}]},
                   {"stages": [stage("x", "weird")]}):  # fmt: skip
        with pytest.raises(results.ResultError):
            results.validate_summary(check_summary(**broken))
    with pytest.raises(results.ResultError):
        results.validate_summary({"run": "check"})


def test_device_slug():
    assert results.device_slug(DEVICE) == "h100"
    assert results.device_slug({"gpu": {"name": "NVIDIA H200"}}) == "h200"
    assert results.device_slug({}) == "cpu"


def test_format_summary_names_the_device_stages_and_failures():
    text = results.format_summary(check_summary(measurements={"attention-hd64": {"rel_fro": 0.003}}))
    assert "NVIDIA H100 80GB HBM3" in text and "580.159.04" in text and "flashinfer 0.6.4" in text
    assert "10 passed, 1 failed" in text and "FAILED tests.gpu.x::test_y" in text and "attention-hd64" in text


def test_junit_counts_and_merge(tmp_path):
    a = tmp_path / "a.xml"
    a.write_text('<testsuites><testsuite name="pytest"><testcase classname="t.a" name="ok"/>'
                 '<testcase classname="t.a" name="bad"><failure message="x"/></testcase>'
                 '<testcase classname="t.a" name="skip"><skipped/></testcase></testsuite></testsuites>')  # fmt: skip
    b = tmp_path / "b.xml"
    b.write_text('<testsuite name="pytest"><testcase classname="t.b" name="err"><error/></testcase></testsuite>')
    counts = results.junit_counts([a, b, tmp_path / "missing.xml"])
    assert counts == {"passed": 1, "failed": 1, "skipped": 1, "errors": 1, "failures": ["t.a::bad", "t.b::err"]}
    merged = results.merge_junit([a, b], tmp_path / "all.xml")
    assert results.junit_counts([merged]) == counts


def test_measurements_round_trip(tmp_path, monkeypatch):
    results.record_measurement("nothing recorded without the variable", {"x": 1})
    monkeypatch.setenv(results.MEASUREMENTS_ENV, str(tmp_path / "m"))
    results.record_measurement("greedy-bfloat16 flashinfer", {"equal": 4})
    assert results.read_measurements(tmp_path / "m") == {"greedy-bfloat16 flashinfer": {"equal": 4}}


def test_pack_then_unpack_and_merge_a_later_call(tmp_path):
    work = bench_work(tmp_path)
    first = {"run": "bench", "version": 1, "started_at": "2026-12-01T10:00:00+0000", "elapsed_s": 560.0,
             "device": DEVICE, "stages": BENCH_STAGES}  # fmt: skip
    results.write_json(work / "summary.json", first)
    (work / "logs").mkdir()
    (work / "logs" / "slo.log").write_text("x" * 100)
    (work / "log.txt").write_text("the command's log\n")
    out1 = tmp_path / "out1"
    written = results.pack(work, out1, "bench", log_file=work / "log.txt")
    assert sorted(p.name for p in written) == ["bench-log.txt", "bench-summary.json", "bench.tar.gz"]
    assert len(written) <= 8 and all(p.stat().st_size <= results.MAX_OUT_FILE_BYTES for p in written)
    with tarfile.open(out1 / "bench.tar.gz") as tar:
        assert {"summary.json", "verify_curve.json", "slo/results.json", "logs/slo.log"} <= set(tar.getnames())

    root = tmp_path / "results"
    dest = results.unpack([out1], results_root=root, log=lambda _: None)
    assert dest == [root / "gpu-bench-h100"]
    merged = json.loads((dest[0] / "summary.json").read_text())
    assert merged["rerun"] == "PYTHONUNBUFFERED=1 python3 -m bench.gpu bench --stages slo"
    assert (dest[0] / "log.txt").read_text() == "the command's log\n"

    # a later call ran only slo (device and warm come along): merged in, nothing lost
    second = dict(first, started_at="2026-12-01T10:12:00+0000", elapsed_s=200.0,
                  stages=[stage("setup"), stage("device", result="device.json"), stage("slo", result="slo/results.json")])
    results.write_json(work / "summary.json", second)
    out2 = tmp_path / "out2"
    results.pack(work, out2, "bench", log_file=work / "log.txt")
    results.unpack([out2], results_root=root, log=lambda _: None)
    merged = json.loads((dest[0] / "summary.json").read_text())
    assert {s["name"]: s["status"] for s in merged["stages"]}["slo"] == "ok"
    assert merged["rerun"] is None and len(merged["calls"]) == 2
    assert merged["highlights"]["slo"]["judged"] == 2 and merged["highlights"]["decode"]
    assert len(list((dest[0] / "summaries").glob("*.json"))) == 2


def test_unpack_through_the_command_line(tmp_path):
    out = subprocess.run([PY, "-m", "bench.gpu", "unpack"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage" in out.stderr


# ----------------------------------------------------------------------------- the near-tie rule


def test_near_tie_rule():
    ref = [1, 2, 3, 4]
    assert judge(ref, ref, margins=[5, 5, 5, 5], delta=0.01, dtype="bfloat16").equal
    tie = judge([1, 2, 9, 9], ref, margins=[5, 5, 0.2, 5], delta=0.05, dtype="bfloat16")
    assert tie.passed and not tie.equal and tie.diverged_at == 2  # 0.2 <= 2 x max(0.05, floor 0.125)
    real = judge([1, 2, 9, 9], ref, margins=[5, 5, 3.0, 5], delta=0.05, dtype="bfloat16")
    assert not real.passed and "margin 3" in real.reason
    assert not judge([1, 2, 9], ref, margins=[5, 5, 1e-3, 5], delta=1e-5, dtype="float32").passed  # 1e-3 > 2e-4
    assert judge([1, 2, 9], ref, margins=[5, 5, 1e-4, 5], delta=1e-5, dtype="float32").passed
    # the floor is two ulps of the top logit: 0.375 passes at a top logit of 40 (2 x 40 x 2^-7 = 0.625), not at 10
    assert judge([1, 9], ref, margins=[5, 0.375], tops=[40, 40], delta=0.0, dtype="bfloat16").passed
    assert not judge([1, 9], ref, margins=[5, 0.375], tops=[10, 10], delta=0.0, dtype="bfloat16").passed
    broken = judge(ref, ref, margins=[5] * 4, delta=2.0, dtype="bfloat16")
    assert not broken.passed and "beyond rounding" in broken.reason
    assert judge([1, 2], ref, margins=[5, 5, 5, 5], delta=0.0, dtype="float32").diverged_at == 2  # shorter differs


def test_the_delta_bound_follows_the_references_own_noise():
    """The H200 run of 2026-11-27: flashinfer's δ 1.047 against HF's bf16 SDPA, which was itself up to
    0.81 from float32 there: bf16 noise (2 x 0.81 allowed), not a broken kernel."""
    ref = [1, 2, 3, 4]
    measured = judge(ref, ref, margins=[5] * 4, delta=1.047, dtype="bfloat16", noise=0.81)
    assert measured.passed and measured.equal and measured.as_dict()["noise"] == 0.81
    assert not judge(ref, ref, margins=[5] * 4, delta=1.047, dtype="bfloat16").passed  # the fixed 1.0 alone
    broken = judge(ref, ref, margins=[5] * 4, delta=3.0, dtype="bfloat16", noise=0.81)  # several units: a bug
    assert not broken.passed and "2 x its own noise 0.81" in broken.reason
    # a small noise never tightens the fixed bound
    assert judge(ref, ref, margins=[5] * 4, delta=0.9, dtype="bfloat16", noise=0.1).passed
