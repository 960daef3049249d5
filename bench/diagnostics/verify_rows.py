"""What a verified row costs the target engine on this machine: ``python -m bench.diagnostics.verify_rows``.

The question behind AdaServe's budget and FASER's early exit: what does one more verified token (a row of
the forward) cost, and is the cost a line or a staircase (matrix tiles)? The target engine alone
(``shared.engine``, no services), ``--batch`` sequences of the chat prompts, each forward verifying N rows in
total, spread as evenly as the batch allows (each sequence: its root plus a chain), rolled back after each
forward so every size sees the same context. Sizes interleaved in every repeat (each sees the same machine
state), medians over ``--repeats``; a least-squares line T = a + b*N per setting. Results:
bench/results/<name>/ (results.json, README.md).

    python -m bench.diagnostics.verify_rows --batch 1,4 --rows 4,8,12,16,17,20,24,32,48 --threads 1,2 --repeats 25
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import typer

from bench.engine_bench import encode
from bench.run_info import machine
from shared.engine.factory import build_target_engine
from shared.engine.runner import ModelRunner, Work
from shared.models.paths import Paths
from shared.models.registry import get_pair

app = typer.Typer(add_completion=False)


def spread(rows: int, batch: int) -> list[int]:
    """Rows per sequence, N over the batch as evenly as it goes (each sequence at least its root row)."""
    rows = max(rows, batch)
    return [rows // batch + (1 if i < rows % batch else 0) for i in range(batch)]


def _ints(text: str, option: str) -> list[int]:
    """A comma-separated list of positive integers, or a usage error naming the option."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"{option} takes positive integers, got {text!r}")
    return values


def line(points: dict[int, float]) -> tuple[float, float]:
    """(a, b) of the least-squares line T = a + b*N through the medians."""
    xs, ys = list(points), list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(sum((x - mx) ** 2 for x in xs), 1e-12)
    return my - b * mx, b


def measure(runner: ModelRunner, prompts: list[list[int]], sizes: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of one forward verifying N rows over len(prompts) sequences, per N."""
    seqs = [runner.add(f"rows-{len(prompts)}-{i}", p) for i, p in enumerate(prompts)]
    runner.forward([Work(s) for s in seqs])  # the prompts cached
    times: dict[int, list[float]] = {n: [] for n in sizes}
    try:
        for _ in range(repeats):
            for n in sizes:
                works = [Work(s, new_nodes=[(100 + j, j - 1) for j in range(c - 1)], want_root=True, want_nodes=True)
                         for s, c in zip(seqs, spread(n, len(seqs)))]  # fmt: skip
                start = time.perf_counter()
                runner.forward(works)
                times[n].append(time.perf_counter() - start)
                for s in seqs:
                    runner.commit(s, [])  # roll back: the same context for every size
    finally:
        for s in seqs:
            runner.release(s.seq_id)
    return {n: statistics.median(v) for n, v in times.items()}


@app.command()
def main(
    pair: str = typer.Option("eagle", help="Model pair whose target is measured."),
    dtype: str = typer.Option("bfloat16"),
    batch: str = typer.Option("1,4", help="Sequences per forward, comma-separated."),
    rows: str = typer.Option("4,8,12,16,17,20,24,32,48", help="Rows per forward (N), comma-separated."),
    threads: str = typer.Option("1,2", help="torch threads, comma-separated (a FASER stack gives the target 1)."),
    repeats: int = typer.Option(25, min=3),
    name: str = typer.Option("verify-rows"),
    home: str = typer.Option(None),
) -> None:
    started = time.time()
    sizes, batches, counts = _ints(rows, "--rows"), _ints(batch, "--batch"), _ints(threads, "--threads")
    target_dir = Paths.resolve(home).model_dir(get_pair(pair).target.name)
    engine, loaded = build_target_engine(target_dir, dtype=dtype)
    cells = []
    for t in counts:
        torch.set_num_threads(t)
        for b in batches:
            prompts = [list(p["input_ids"]) if hasattr(p, "keys") else list(p) for p in encode(loaded.tokenizer, b)]
            ms = {n: s * 1e3 for n, s in measure(engine.runner, prompts, [n for n in sizes if n >= b], repeats).items()}
            a, slope = line(ms)
            cells.append({"threads": t, "batch": b, "median_ms": ms, "line_ms": {"a": a, "per_row": slope}})
            print(f"threads {t} batch {b}: " + "  ".join(f"{n}:{v:.1f}" for n, v in ms.items())
                  + f"   line {a:.1f} ms + {slope:.3f} ms/row")  # fmt: skip
    results = {"name": name, "command": "python -m bench.diagnostics.verify_rows " + " ".join(sys.argv[1:]),
               "machine": machine(counts[-1]), "started_unix": started,
               "duration_s": time.time() - started, "target": str(target_dir), "dtype": dtype, "repeats": repeats,
               "cells": cells}  # fmt: skip
    out = Path(__file__).resolve().parents[1] / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "README.md").write_text(readme(results))
    print(f"results in {out}")


def readme(r: dict) -> str:
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r["started_unix"]))
    sizes = sorted({int(n) for c in r["cells"] for n in c["median_ms"]})
    m = r["machine"]
    lines = [f"# {r['name']}", "", f"Command: `{r['command']}`  ",
             f"Machine: {m['cpu_model']}, {m['cpu_count']} CPUs, {m['platform']}, torch {m['torch']}  ",
             f"Date: {when}; duration {r['duration_s']:.0f} s; target {Path(r['target']).name}, {r['dtype']}, "
             f"medians of {r['repeats']} interleaved repeats", "",
             "One target forward verifying N rows in total over the batch's sequences (ms):", "",
             "| threads | batch | " + " | ".join(f"N={n}" for n in sizes) + " | line: a + b·N |",
             "|---|---|" + "---|" * len(sizes) + "---|"]  # fmt: skip
    for c in r["cells"]:
        ms = {int(n): v for n, v in c["median_ms"].items()}
        cols = " | ".join(f"{ms[n]:.1f}" if n in ms else "–" for n in sizes)
        lines.append(f"| {c['threads']} | {c['batch']} | {cols} | {c['line_ms']['a']:.1f} + {c['line_ms']['per_row']:.3f}·N |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app()
