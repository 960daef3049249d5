"""`make gpu-check`: the GPU machine's first command, within one 10-minute device call.

    python3 -m bench.gpu check             (on the GPU machine, with the last load carried)
    python -m bench.gpu check --dry-run    (anywhere: the stages it would run, as JSON)

Standard library only at import: it runs before the carried wheels are installed. In order::

    setup        stage the carried load, reassemble the GGUF, pip install the wheels offline,
                 build protos, prepare the demo pair (`tandem models prepare`, offline)
    warm         flashinfer's JIT compile, started in the background as soon as the wheels are in
    device       nvidia-smi, torch, CUDA, flashinfer: device.json (+ nvidia-smi.txt)
    tests-gpu    pytest -m gpu tests: every GPU-marked test (tests/gpu: flashinfer == SDPA on the
                 same paged KV, greedy == HF generate, the whole stack on the demo pair)
    tests-cuda   the CUDA-gated tests that carry no marker (flashinfer vs SDPA through two runners,
                 MPS percentages, device resolution)

under TANDEM_GPU_STRICT=1 (a missing flashinfer or model fails instead of skipping). Results go
to bench/results/gpu-check/ in the machine's copy and, packed, to $OUT (results.py), including
summary.json with the test counts and what the tests measured (errors, margins, δ).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu import kit, results
from bench.gpu.budget import RunLog, Stage, run_stages

RUN = "check"
DEADLINE_S = 560.0  # the device call stops at 600 s
WARM_BUDGET_S = 300.0
TESTS_RESERVE_S = 320.0  # what the tests get at least, however long the JIT compile takes
# CUDA-gated tests without the gpu marker (not this kit's files); tests/gpu_kit checks they exist.
CUDA_AWARE_TESTS = (
    "tests/shared/engine/test_flashinfer_backend.py",
    "tests/shared/profiling/test_profile_shares_run.py::test_mps_percentages_on_cuda",
    "tests/shared/test_loading.py::test_dtype_and_device_resolution",
)

# Modules `pytest -m gpu tests` must not import there: no GPU test in them, and they need packages the
# kit does not carry. Each is named with why; tests/gpu_kit checks they exist and hold no GPU test.
NOT_COLLECTED = {
    "tests/e2e/test_http_api.py": "imports the openai client (dev extra: openai, httpx2, httpcore2, jiter, ...)",
}


def work_dir() -> Path:
    return results.RESULTS_ROOT / f"gpu-{RUN}"


def plan_stages(work: Path, python: str = sys.executable) -> list[Stage]:
    pytest = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--timeout", "300", "-rfEs",
              "--continue-on-collection-errors"]  # a module that cannot import here must not stop the GPU tests
    return [
        Stage("device", [python, "-m", "bench.gpu.device", "--out", str(work / "device.json")], 60, 5,
              result="device.json"),  # fmt: skip
        Stage("tests-gpu", [*pytest, "-m", "gpu", *[f"--ignore={path}" for path in NOT_COLLECTED], "--junitxml",
                            str(work / "junit-gpu.xml"), "tests"], 330, 60, budget_arg=False),  # fmt: skip
        Stage("tests-cuda", [*pytest, "--junitxml", str(work / "junit-cuda.xml"), *CUDA_AWARE_TESTS], 150, 30,
              budget_arg=False),  # fmt: skip
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu check")
    parser.add_argument("--budget-s", type=float, default=DEADLINE_S, help="the whole command's time")
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None, help="default: $OUT")
    parser.add_argument("--dry-run", action="store_true", help="print the stages as JSON; run nothing")
    args = parser.parse_args(argv)
    work = work_dir()
    if args.dry_run:
        print(json.dumps([s.__dict__ for s in plan_stages(work)], indent=1))
        return 0
    deadline = time.monotonic() + args.budget_s
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log = RunLog(work / "log.txt")
    summary = {"run": RUN, "version": results.SUMMARY_VERSION, "started_at": results.now(), "elapsed_s": 0.0,
               "device": {}, "setup": {}, "stages": [],
               "tests": {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}, "measurements": {}}  # fmt: skip
    warm: dict = {}

    def save(stage_records=None) -> None:
        if stage_records is not None:
            summary["stages"] = [r.to_dict() for r in stage_records]
        summary["elapsed_s"] = round(log.elapsed(), 1)
        results.write_json(work / "summary.json", summary)

    def start_warm(env: dict[str, str]) -> None:
        out = open(work / "logs" / "warm.log", "ab")
        cmd = [sys.executable, "-m", "bench.gpu.warm", "--out", str(work / "flashinfer_warm.json")]
        warm["proc"] = subprocess.Popen(cmd, cwd=kit.REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        warm["t0"] = time.monotonic()
        log("flashinfer JIT warm-up started in the background")

    (work / "logs").mkdir(exist_ok=True)
    code = 0
    try:
        try:
            summary["setup"] = kit.setup(log=log, after_install=start_warm)
        except kit.NotStaged as exc:
            log(f"NOT STAGED: {exc}")
            summary["setup"] = {"error": str(exc), "not_staged": True}
            summary["stages"] = [{"name": "setup", "status": "failed", "elapsed_s": round(log.elapsed(), 1),
                                  "budget_s": 0.0, "reason": str(exc)}]  # fmt: skip
            return 3
        except kit.KitError as exc:
            log(f"setup failed: {exc}")
            summary["setup"] = {"error": str(exc)}
            summary["stages"] = [{"name": "setup", "status": "failed", "elapsed_s": round(log.elapsed(), 1),
                                  "budget_s": 0.0, "reason": str(exc)[:500]}]  # fmt: skip
            return 2
        env = kit.site_env()
        env.update({"TANDEM_GPU_STRICT": "1", results.MEASUREMENTS_ENV: str(work / "measurements")})
        setup_record = {"name": "setup", "status": "ok", "elapsed_s": summary["setup"]["timings"]["total_s"],
                        "budget_s": 0.0, "reason": ""}  # fmt: skip
        records = run_stages(plan_stages(work)[:1], deadline=deadline, out_dir=work, env=env, cwd=kit.REPO_ROOT,
                             log=log)  # fmt: skip
        warm_record = _join_warm(warm, deadline, log)
        save_records = [setup_record, *[r.to_dict() for r in records], warm_record]
        summary["stages"] = save_records
        save()
        more = run_stages(plan_stages(work)[1:], deadline=deadline, out_dir=work, env=env, cwd=kit.REPO_ROOT,
                          log=log, on_record=lambda rs: None)  # fmt: skip
        if warm_record["status"] == "timeout":  # it went on compiling during the tests
            _settle_warm(warm, warm_record, log)
        summary["stages"] = save_records + [r.to_dict() for r in more]
        if (work / "device.json").is_file():
            summary["device"] = json.loads((work / "device.json").read_text())
        junits = [work / "junit-gpu.xml", work / "junit-cuda.xml"]
        summary["tests"] = results.junit_counts(junits)
        results.merge_junit(junits, work / "junit.xml")
        summary["measurements"] = results.read_measurements(work / "measurements")
        failed = summary["tests"]["failed"] + summary["tests"]["errors"]
        code = 1 if failed or any(s["status"] != "ok" for s in summary["stages"]) else 0
        return code
    finally:
        _kill_group(warm.get("proc"))
        save()
        log(results.format_summary(summary))
        if args.out:
            written = results.pack(work, Path(args.out), RUN, log_file=work / "log.txt",
                                   junit=work / "junit.xml" if (work / "junit.xml").is_file() else None)  # fmt: skip
            log(f"results in {args.out}: {', '.join(p.name for p in written)}")


def _join_warm(warm: dict, deadline: float, log) -> dict:
    """Wait for the background JIT compile, leaving the tests TESTS_RESERVE_S; its stage record.

    One still compiling then is left running (the tests need the same kernels and wait on
    flashinfer's lock for them), and its record is settled after the tests (``_settle_warm``)."""
    proc = warm.get("proc")
    if proc is None:
        return {"name": "warm", "status": "skipped", "elapsed_s": 0.0, "budget_s": 0.0, "reason": "not started"}
    wait = min(WARM_BUDGET_S - (time.monotonic() - warm["t0"]), deadline - time.monotonic() - TESTS_RESERVE_S)
    try:
        proc.wait(timeout=max(wait, 1.0))
    except subprocess.TimeoutExpired:
        log("flashinfer JIT warm-up still compiling: the tests start, it goes on")
    record = {"name": "warm", "status": "timeout", "elapsed_s": 0.0, "budget_s": WARM_BUDGET_S, "reason": "",
              "result": "flashinfer_warm.json", "log": "logs/warm.log"}  # fmt: skip
    return _settle_warm(warm, record, log)


def _settle_warm(warm: dict, record: dict, log) -> dict:
    proc = warm["proc"]
    rc = proc.poll()
    record["elapsed_s"] = round((warm.get("t_end") or time.monotonic()) - warm["t0"], 1)
    if rc is None:
        record.update(status="timeout", reason="still compiling when the tests started")
    else:
        warm.setdefault("t_end", time.monotonic())
        record.update(status="ok" if rc == 0 else "failed", reason="" if rc == 0 else f"exit {rc}: see logs/warm.log")
    log(f"[stage] warm: {record['status']} after {record['elapsed_s']:.0f} s {record['reason']}")
    return record


def _kill_group(proc: subprocess.Popen | None) -> None:
    """The warm-up and the nvcc/ninja processes it started (its own session)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
