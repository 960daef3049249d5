"""bench-slo and bench-faser on the GPU: the harness presets, shortened to fit a device call, on CUDA in bf16.

    python -m bench.gpu.serving --preset faser --out-dir DIR [--pair demo]
    python -m bench.gpu.serving --preset slo --out-dir DIR

The same code as `make bench-faser` / `make bench-slo` (bench.harness.run_bench with the presets'
configurations), with the stacks launched on CUDA in bfloat16 (attention "auto": flashinfer when
installed) and fewer requests::

    faser   FASER_SWEEP (serial, +pipelining, +early exit, both) at batch 1 only: 4 prompts x 64 tokens
            (FASER's goal is batch-1 TPOT); the stacks' draft share 0.5 is an MPS split, so an MPS
            daemon runs for the stage (its own pipe directory; recorded as "mps" in the result)
    slo     SLO_SWEEP less AdaServe's options (target-only, a chain of 3, SpecInfer, EqualGreedy,
            GlobalGreedy, AdaServe as printed: a seventh stack would not fit the stage's device time) on the
            60/20/20 mix, Poisson at 2x and 4x the batch-1 capacity, 12 requests each, no share phase;
            the tree policies' budget B is the GPU profile verify_curve stored

Both interleave (every stack up at once, started together: one after the other, each took ~25 s
on an H200, 2026-11-28, and the stage's budget ran out before the last configurations).
``--long`` keeps the presets' full sizes (for a machine with time to spare). The harness
writes results.json and its plots into --out-dir; a summary of what ran is added as gpu_serving.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


# Warm-up requests per stack before anything is measured. One was not enough on a fresh H200 process
# (2026-11-28: the first configuration served showed TTFT 334 ms and TPOT 133 ms against 79.5 ms later).
GPU_WARMUP = 3


def gpu_slo_sweep() -> list[str]:
    """SLO_SWEEP with AdaServe as printed only: a seventh stack would not fit the stage's device time."""
    from bench.harness import SLO_SWEEP

    return [c for c in SLO_SWEEP if not c.startswith("policy:adaserve:")]


def options(preset: str, pair: str, *, long: bool, budget_s: float, device: str = "cuda"):
    from bench.harness import FASER_SWEEP, SLO_SWEEP, faser_options, slo_options
    from bench.stack import Models

    models = Models(pair=pair, device=device, dtype="bfloat16" if device.startswith("cuda") else "float32")
    if preset == "faser":
        opts = faser_options(name=f"gpu-faser-{pair}", models=models)
        if not long:
            opts = replace(opts, batch1=list(FASER_SWEEP), sweep=[], num_prompts=4, max_new_tokens=64, repeats=1,
                           interleave=True, warmup=GPU_WARMUP)
        return opts
    if preset == "slo":
        opts = slo_options(name=f"gpu-slo-{pair}", models=models)
        if not long:
            factors = [2.0, 4.0] if budget_s >= 200 else [3.0]
            opts = replace(opts, sweep=gpu_slo_sweep(), sweep_requests=12, rate_factors=factors, stringent_shares=[],
                           interleave=True, warmup=GPU_WARMUP)
        return opts
    raise ValueError(f"unknown preset {preset!r}: faser or slo")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.serving")
    parser.add_argument("--preset", choices=("faser", "slo"), required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--long", action="store_true", help="the presets' full sizes")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-run this module")
    parser.add_argument("--mps", choices=("auto", "on", "off"), default="auto",
                        help="run an MPS daemon for the stage (auto: for faser, whose stacks split the GPU)")  # fmt: skip
    args = parser.parse_args(argv)
    from bench.gpu.sm_split import mps_start, mps_stop
    from bench.harness import run_bench

    opts = options(args.preset, args.pair, long=args.long, budget_s=args.budget_s, device=args.device)
    use_mps = args.mps == "on" or (args.mps == "auto" and args.preset == "faser" and args.device.startswith("cuda"))
    mps_env, why, root = None, "not used", None
    if use_mps:
        root = Path(tempfile.mkdtemp(prefix="tandem-mps-"))
        mps_env, why = mps_start(root)
        if mps_env is not None:  # the launched services inherit the pipe directory: they become MPS clients
            for key in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
                os.environ[key] = mps_env[key]
    t = time.monotonic()
    try:
        results = run_bench(opts, out_dir=args.out_dir)
    finally:
        mps_stop(mps_env)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
    results["gpu_serving"] = {"preset": args.preset, "pair": args.pair, "long": args.long,
                              "mps": {"used": mps_env is not None, "reason": why},
                              "seconds": round(time.monotonic() - t, 1)}  # fmt: skip
    (args.out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
