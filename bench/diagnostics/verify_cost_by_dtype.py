"""What one verify step costs the target engine per dtype on this CPU: ``python -m bench.diagnostics.verify_cost_by_dtype``.

Decides which ``--dtype`` a benchmark should use on a given machine: on a CPU without native bf16
matmuls (no AVX512-BF16 / AMX, ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` False) the engine's
bf16 path runs without oneDNN-prepacked weights, and a verify of k drafted tokens grows much faster
with k than in float32. The target engine alone (``shared.engine``, no services), batch 1, a
200-token context, a chain of k tokens verified ``--steps`` times (the first 5 are warm-up), median.
Results: bench/results/<name>/ (results.json, README.md).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import typer

from bench.harness import machine
from shared.engine.factory import build_target_engine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem
from shared.models.paths import Paths
from shared.models.registry import get_pair

app = typer.Typer(add_completion=False)


def verify_ms(engine, ks: list[int], steps: int) -> dict[int, float]:
    """Median ms of a verify with a chain of k tokens, per k (the sequence grows as steps commit)."""
    engine.prefill([PrefillItem("probe", list(range(100, 300)))])
    out = {}
    for k in ks:
        times = []
        for _ in range(steps):
            tree = TokenTree.chain([123 + j for j in range(k)])
            t = time.perf_counter()
            engine.verify([VerifyItem("probe", tree)])
            times.append(time.perf_counter() - t)
        out[k] = statistics.median(times[5:]) * 1e3
    engine.release(["probe"])
    return out


@app.command()
def main(pair: str = typer.Option("eagle", help="Model pair whose target is measured."),
         dtypes: str = typer.Option("bfloat16,float32"), ks: str = typer.Option("0,1,3,5"),
         steps: int = typer.Option(25, min=6), threads: int = typer.Option(2),
         name: str = typer.Option("verify-cost-by-dtype"), home: str = typer.Option(None)) -> None:
    torch.set_num_threads(threads)
    started = time.time()
    target_dir = Paths.resolve(home).model_dir(get_pair(pair).target.name)
    chain = [int(k) for k in ks.split(",")]
    rows = {}
    for dtype in dtypes.split(","):
        engine, _ = build_target_engine(target_dir, dtype=dtype)
        rows[dtype] = verify_ms(engine, chain, steps)
    results = {"name": name, "command": "python -m bench.diagnostics.verify_cost_by_dtype " + " ".join(sys.argv[1:]),
               "machine": machine(threads), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
               "native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()), "target": str(target_dir),
               "ms_by_dtype_k": rows}
    lines = [f"# {name}", "", f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
             f"Date: {results['date']}; native bf16 matmul: {results['native_bf16']}  ", "",
             "Median ms of one target verify at batch 1 (200-token context), chain of k drafted tokens:", "",
             "| dtype | " + " | ".join(f"k = {k}" for k in chain) + " |", "|---|" + "---|" * len(chain)]
    lines += [f"| {d} | " + " | ".join(f"{v[k]:.1f}" for k in chain) + " |" for d, v in rows.items()]
    out = Path("bench/results") / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    app()
