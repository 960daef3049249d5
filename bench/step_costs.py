"""What a step cost through the whole stack, per batch size and chain length, from a results.json.

    python -m bench.step_costs bench/results/adaptive-eagle/results.json              # every configuration
    python -m bench.step_costs bench/results/adaptive-eagle/results.json --config tandem-k1 --phase sweep

The harness stores, per (phase, load, configuration), the median scheduler phase times of the steps at each
(batch size b, longest chain k) (``overhead.step_ms_by_batch_k``, from the commit spans). Pooled here over
the loads (weighted by steps), they are the T(k; b) a length policy's cost model must predict: where
k = 1's verify + speculate outgrows (1 + alpha) times plain decoding's, speculation stops paying.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

PHASES = ("total", "verify", "speculate")


def pooled(results: dict, config: str | None = None, phase: str | None = None) -> dict[str, dict[tuple[int, int], dict]]:
    """config -> (b, k) -> {n, total, verify, speculate}: step-weighted means of the per-load medians."""
    out: dict[str, dict[tuple[int, int], dict]] = {}
    for ph in ("batch1", "sweep", "closed", "bursty", "mix"):
        if phase and ph != phase:
            continue
        for per in (results.get(ph) or {}).values():
            for name, row in per.items():
                if config and name != config:
                    continue
                cells = ((row.get("overhead") or {}).get("step_ms_by_batch_k")) or {}
                for key, cell in cells.items():
                    b, k = (int(part.split("=")[1]) for part in key.split(","))
                    acc = out.setdefault(name, {}).setdefault((b, k), {"n": 0, **{p: 0.0 for p in PHASES}})
                    for p in PHASES:
                        acc[p] += cell[p] * cell["n"]
                    acc["n"] += cell["n"]
    for cells in out.values():
        for acc in cells.values():
            for p in PHASES:
                acc[p] /= max(acc["n"], 1)
    return out


def table(name: str, cells: dict[tuple[int, int], dict], min_steps: int) -> Table:
    t = Table(title=f"{name}: step phase times (ms), medians per load pooled")
    for col in ("b", "k", "steps", "verify", "speculate", "verify + speculate", "total"):
        t.add_column(col, justify="right")
    for (b, k), c in sorted(cells.items()):
        if c["n"] >= min_steps:
            t.add_row(str(b), str(k), str(c["n"]), f"{c['verify']:.1f}", f"{c['speculate']:.1f}",
                      f"{c['verify'] + c['speculate']:.1f}", f"{c['total']:.1f}")  # fmt: skip
    return t


def main(
    results: Path = typer.Argument(..., help="A harness results.json."),
    config: str | None = typer.Option(None, help="Only this configuration."),
    phase: str | None = typer.Option(None, help="Only this phase (batch1, sweep, closed, bursty, mix)."),
    min_steps: int = typer.Option(5, help="Hide cells with fewer steps."),
) -> None:
    console = Console(width=160)
    data = pooled(json.loads(results.read_text()), config, phase)
    if not data:
        console.print("no step_ms_by_batch_k in this results.json (run with traces on, after this field was added)")
        raise typer.Exit(1)
    for name, cells in sorted(data.items()):
        console.print(table(name, cells, min_steps))


if __name__ == "__main__":
    typer.run(main)
