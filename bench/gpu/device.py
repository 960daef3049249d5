"""What the results were measured on: GPU, driver, CUDA, torch, flashinfer, MPS, green contexts.

    python -m bench.gpu.device --out device.json      (prints it too)

Every probe is allowed to fail: the description says what it could not read.
``nvidia-smi -q`` is kept whole beside the JSON (``nvidia-smi.txt``); its clocks,
power limit and compute mode are read, never changed (METHOD.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

SMI_FIELDS = ("name", "driver_version", "memory.total", "compute_mode", "mig.mode.current", "clocks.max.sm",
              "clocks.max.memory", "power.limit", "pcie.link.gen.current", "temperature.gpu")  # fmt: skip


def _cmd(args: list[str], timeout: float = 20.0) -> str | None:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def nvidia_smi() -> dict:
    out = _cmd(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader"])
    if not out:
        return {"error": "nvidia-smi not available"}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")]
    return dict(zip(SMI_FIELDS, values))


def describe() -> dict:
    d: dict = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "nvidia_smi": nvidia_smi(),
        "mps_control": shutil.which("nvidia-cuda-mps-control"),
        "nvcc": (_cmd(["nvcc", "--version"]) or "").strip().splitlines()[-1:] or None,
    }
    try:
        import torch

        d["torch"] = torch.__version__
        d["cuda"] = torch.version.cuda
        d["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            d["gpu"] = {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "l2_cache_mb": round(getattr(p, "L2_cache_size", 0) / 1e6, 1),
                "driver": d["nvidia_smi"].get("driver_version"),
                "count": torch.cuda.device_count(),
            }
            d["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        else:
            d["gpu"] = None
        try:
            from torch.cuda import green_contexts  # noqa: F401

            d["green_contexts"] = "torch.cuda.green_contexts"
        except ImportError as exc:
            d["green_contexts"] = f"unavailable: {exc}"
    except ImportError as exc:
        d["torch"] = f"unavailable: {exc}"
    for module in ("transformers", "flashinfer", "tvm_ffi", "grpc", "google.protobuf", "triton"):
        try:
            mod = __import__(module, fromlist=["__version__"])
            d[module.replace("google.", "")] = getattr(mod, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - a probe: report whatever failed
            d[module.replace("google.", "")] = f"unavailable: {type(exc).__name__}: {exc}"[:200]
    return d


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.device")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=None, help="accepted for the stage runner; unused")
    args = parser.parse_args(argv)
    d = describe()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(d, indent=2, default=str) + "\n")
    if (full := _cmd(["nvidia-smi", "-q"])) is not None:
        (args.out.parent / "nvidia-smi.txt").write_text(full)
    json.dump(d, sys.stdout, indent=1, default=str)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
