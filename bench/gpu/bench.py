"""`make gpu-bench`: the GPU machine's second command, timed stages within one 10-minute device call.

    python3 -m bench.gpu bench                       (on the GPU machine, after `check` on the same machine)
    python3 -m bench.gpu bench --stages slo          (a later call: only these stages)
    python -m bench.gpu bench --dry-run              (anywhere: the stages and budgets, as JSON)

Standard library only at import. Setup first (idempotent: seconds on the machine `check` set up;
the whole setup on a fresh one), then the stages in this order, each a subprocess with a budget
(budget.py: a stage that runs out of time is stopped and recorded as "timeout", one that would
not get its minimum is "skipped"; what finished stays)::

    stage          budget  min   what                                                    result
    device           30     5    GPU, driver, CUDA, torch, flashinfer                    device.json
    warm            240    30    flashinfer JIT compile (cached after check)             flashinfer_warm.json
    verify_curve    150    40    T(N), N = 1..256, and B: demo target and a random       verify_curve.json
                                 Llama-8B shape, SDPA and flashinfer
    decode           90    30    tok/s Tandem vs HF generate at batch 1/16/64,           decode.json
                                 SDPA and flashinfer
    faser           230   100    bench-faser, batch 1 (TPOT), MPS split                  faser/results.json
    sm_split        150    60    draft+target at once: time-slicing, MPS, green ctx      sm_split.json
    slo             270   150    bench-slo at 2x and 4x capacity                         slo/results.json

A serving stage (faser, slo) runs one stack per policy, ~25 s each to start on an H200 (2026-11-28)
before 7-13 s of serving: they are interleaved and started at once, and the harness checkpoints
results.json ("partial": true) after every configuration, so a stage stopped at its budget keeps
what it measured. ``--attention sdpa`` serves them with PyTorch SDPA and drops ``warm`` (no
flashinfer JIT compile, ~6 minutes on a fresh machine).

then plots (verify_curve.png, decode.png, sm_split.png; the harness draws its own) and the
summary with highlights (results.py). Stages left out are named in the summary's "rerun": the
exact command for another call while the machine is warm.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu import kit, results
from bench.gpu.budget import RunLog, Stage, StageRecord, run_stages

RUN = "bench"
DEADLINE_S = 570.0


def work_dir() -> Path:
    return results.RESULTS_ROOT / f"gpu-{RUN}"


def plan_stages(work: Path, python: str = sys.executable, pair: str = "demo") -> list[Stage]:
    m = [python, "-m"]
    return [
        Stage("device", [*m, "bench.gpu.device", "--out", str(work / "device.json")], 30, 5, "device.json"),
        Stage("warm", [*m, "bench.gpu.warm", "--out", str(work / "flashinfer_warm.json")], 240, 30,
              "flashinfer_warm.json"),  # fmt: skip
        Stage("verify_curve", [*m, "bench.gpu.verify_curve", "--out", str(work / "verify_curve.json")], 150, 40,
              "verify_curve.json"),  # fmt: skip
        Stage("decode", [*m, "bench.gpu.decode", "--out", str(work / "decode.json")], 90, 30, "decode.json"),
        Stage("faser", [*m, "bench.gpu.serving", "--preset", "faser", "--pair", pair, "--out-dir", str(work / "faser")],
              230, 100, "faser/results.json"),  # fmt: skip  # 4 stacks x ~45 s on an H200 (2026-11-28)
        Stage("sm_split", [*m, "bench.gpu.sm_split", "--out", str(work / "sm_split.json")], 150, 60, "sm_split.json"),
        Stage("slo", [*m, "bench.gpu.serving", "--preset", "slo", "--pair", pair, "--out-dir", str(work / "slo")],
              270, 150, "slo/results.json"),  # fmt: skip
    ]


def rerun_command(records: list[dict], attention: str = "auto") -> str | None:
    """The call that runs the stages this one skipped or cut short (device and warm come along)."""
    left = [r["name"] for r in records if r["status"] in ("skipped", "timeout") and r["name"] not in ("device", "warm")]
    if not left:
        return None
    flag = "" if attention == "auto" else f" --attention {attention}"
    return f"PYTHONUNBUFFERED=1 python3 -m bench.gpu bench --stages {','.join(left)}{flag}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu bench")
    parser.add_argument("--budget-s", type=float, default=DEADLINE_S, help="the whole command's time")
    parser.add_argument("--stages", default="", help="comma-separated subset (device and warm always run)")
    parser.add_argument("--pair", default=os.environ.get("TANDEM_GPU_PAIR", "demo"),
                        help="model pair of bench-faser/bench-slo (default demo; TANDEM_GPU_PAIR)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=os.environ.get("OUT") or None, help="default: $OUT")
    parser.add_argument("--attention", choices=("auto", "sdpa"), default="auto",
                        help="the serving stages' services (TANDEM_ATTENTION_BACKEND); sdpa also drops the warm stage: "
                        "no flashinfer JIT compile (~6 min on a fresh machine) before faser/slo")  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="print the stages as JSON; run nothing")
    args = parser.parse_args(argv)
    work = work_dir()
    stages = plan_stages(work, pair=args.pair)
    if args.stages:
        wanted = {"device", "warm", *args.stages.split(",")}
        unknown = wanted - {s.name for s in stages}
        if unknown:
            parser.error(f"unknown stages {sorted(unknown)}; known: {[s.name for s in stages]}")
        stages = [s for s in stages if s.name in wanted]
    if args.attention == "sdpa":
        stages = [s for s in stages if s.name != "warm"]
    if args.dry_run:
        print(json.dumps([s.__dict__ for s in stages], indent=1))
        return 0
    deadline = time.monotonic() + args.budget_s
    if work.exists() and not args.stages:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    log = RunLog(work / "log.txt")
    summary = {"run": RUN, "version": results.SUMMARY_VERSION, "started_at": results.now(), "elapsed_s": 0.0,
               "device": {}, "setup": {}, "stages": [], "highlights": {}, "pair": args.pair,
               "attention": args.attention}  # fmt: skip

    def save(records=None) -> None:
        if records is not None:
            summary["stages"] = [summary["stages"][0]] + [r.to_dict() for r in records]
        summary["elapsed_s"] = round(log.elapsed(), 1)
        results.write_json(work / "summary.json", summary)

    code = 0
    try:
        t = time.monotonic()
        try:
            summary["setup"] = kit.setup(log=log, pairs=tuple(dict.fromkeys(("demo", args.pair))))
            setup = StageRecord("setup", "ok", 0.0, elapsed_s=round(time.monotonic() - t, 1))
        except kit.KitError as exc:
            log(f"{'NOT STAGED' if isinstance(exc, kit.NotStaged) else 'setup failed'}: {exc}")
            summary["setup"] = {"error": str(exc), "not_staged": isinstance(exc, kit.NotStaged)}
            summary["stages"] = [StageRecord("setup", "failed", 0.0, round(time.monotonic() - t, 1),
                                             reason=str(exc)[:500]).to_dict()]  # fmt: skip
            return 3 if isinstance(exc, kit.NotStaged) else 2
        summary["stages"] = [setup.to_dict()]
        save()
        env = kit.site_env()
        if args.attention != "auto":  # the launched services read it (services/settings.py)
            env["TANDEM_ATTENTION_BACKEND"] = args.attention
        if not _has_flashinfer(env):
            stages = [s for s in stages if s.name != "warm"]
        records = run_stages(stages, deadline=deadline, out_dir=work, env=env, cwd=kit.REPO_ROOT, log=log,
                             on_record=save)  # fmt: skip
        save(records)
        if (work / "device.json").is_file():
            summary["device"] = json.loads((work / "device.json").read_text())
        summary["highlights"] = results.highlights(work, summary["stages"])
        summary["rerun"] = rerun_command(summary["stages"], attention=args.attention)
        left = deadline - time.monotonic()
        if left > 15:
            plots = subprocess.run([sys.executable, "-m", "bench.gpu.plots", str(work)], cwd=kit.REPO_ROOT, env=env,
                                   capture_output=True, text=True, timeout=max(5.0, left - 10))  # fmt: skip
            log(f"plots: {(plots.stdout + plots.stderr).strip()[-300:]}")
        code = 0 if all(s["status"] == "ok" for s in summary["stages"]) else 1
        return code
    except subprocess.TimeoutExpired:
        log("plots: out of time")
        return 1
    finally:
        save()
        log(results.format_summary(summary))
        if args.out:
            written = results.pack(work, Path(args.out), RUN, log_file=work / "log.txt")
            log(f"results in {args.out}: {', '.join(p.name for p in written)}")


def _has_flashinfer(env: dict[str, str]) -> bool:
    done = subprocess.run([sys.executable, "-c", "import flashinfer"], env=env, capture_output=True)
    return done.returncode == 0
