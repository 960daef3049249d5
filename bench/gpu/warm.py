"""Compile flashinfer's kernels before anything times them (JIT: nvcc on the machine, minutes the first time).

    python -m bench.gpu.warm --out flashinfer_warm.json

One call of the flashinfer backend per head dim Tandem's GPU runs use (64: SmolLM2 and its
draft, 128: the Llama-shaped target of the verify-cost curve), each with an all-causal batch
(flashinfer's causal path, FA3 on Hopper) and a tree batch (its custom-mask path, FA2). Kernels
land in flashinfer's cache (~/.cache/flashinfer), which later processes on the same machine load.
The result records how long each first call took, i.e. the compile time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SHAPES = {"hd64-gqa3": (64, 9, 3), "hd128-gqa4": (128, 32, 8)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.warm")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=None)
    args = parser.parse_args(argv)
    import flashinfer
    import torch

    from bench.gpu.paged_case import build_case, run_backends

    result = {"stage": "flashinfer_warm", "flashinfer": flashinfer.__version__, "torch": torch.__version__,
              "configs": []}  # fmt: skip
    for shape, (head_dim, heads, kv_heads) in SHAPES.items():
        for tree in (False, True):
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
            result["configs"].append(row)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps(row), flush=True)
    return 0 if all(r["ok"] for r in result["configs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
