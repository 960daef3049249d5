"""Compile flashinfer's kernels before anything times them (JIT: nvcc on the machine, minutes the first time).

    python -m bench.gpu.warm --out flashinfer_warm.json

One call of the flashinfer backend per head dim Tandem's GPU runs use (64: SmolLM2 and its
draft, 128: the Llama-shaped target of the verify-cost curve), each with an all-causal batch
(flashinfer's causal path, FA3 on Hopper) and a tree batch (its custom-mask path, FA2): four
modules, compiled at once by four processes. Kernels land in flashinfer's cache
(~/.cache/flashinfer), which later processes on the same machine load. The result records how
long each first call took, i.e. the compile time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {"hd64-gqa3": (64, 9, 3), "hd128-gqa4": (128, 32, 8)}


def one(shape: str, tree: bool) -> dict:
    """Run one config through the flashinfer backend (compiling its module the first time)."""
    from bench.gpu.paged_case import build_case, run_backends

    head_dim, heads, kv_heads = SHAPES[shape]
    t = time.perf_counter()
    row = {"shape": shape, "tree": tree}
    try:
        case = build_case(head_dim=head_dim, num_heads=heads, num_kv_heads=kv_heads, tree=tree, device="cuda")
        run_backends(case, ["flashinfer"], reference=False)
        row["ok"] = True
    except Exception as exc:  # noqa: BLE001 - recorded; the tests report it properly
        row["ok"] = False
        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    row["seconds"] = round(time.perf_counter() - t, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.warm")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--one", default=None, help="SHAPE:causal|tree, in this process (the parent runs all four)")
    args = parser.parse_args(argv)
    if args.one:
        shape, _, kind = args.one.partition(":")
        row = one(shape, kind == "tree")
        args.out.write_text(json.dumps(row) + "\n")
        return 0 if row["ok"] else 1
    # the four modules compile at once, one process each, their ninja jobs splitting the cores (an nvcc of
    # CUTLASS/FA3 code takes GBs of memory: 4 x cores parallel jobs could exhaust the machine's 128 GiB)
    import flashinfer
    import torch

    jobs = max(1, (os.cpu_count() or 4) // 4)

    result = {"stage": "flashinfer_warm", "flashinfer": flashinfer.__version__, "torch": torch.__version__,
              "configs": []}  # fmt: skip
    t0 = time.perf_counter()
    procs = []
    for shape in SHAPES:
        for kind in ("causal", "tree"):
            out = args.out.with_name(f"{args.out.stem}-{shape}-{kind}.json")
            cmd = [sys.executable, "-m", "bench.gpu.warm", "--out", str(out), "--one", f"{shape}:{kind}"]
            env = {**os.environ, "MAX_JOBS": os.environ.get("MAX_JOBS", str(jobs))}
            procs.append((shape, kind, out, subprocess.Popen(cmd, env=env)))
    for shape, kind, out, proc in procs:
        proc.wait()
        try:
            row = json.loads(out.read_text())
            out.unlink()
        except (OSError, ValueError):
            row = {"shape": shape, "tree": kind == "tree", "ok": False, "error": f"exit {proc.returncode}"}
        result["configs"].append(row)
        print(json.dumps(row), flush=True)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["max_jobs_each"] = jobs
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["ok"] for r in result["configs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
