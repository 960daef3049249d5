"""The adaptive-length goals, checked on a `bench-adaptive` results.json.

    python -m bench.adaptive_goals bench/results/adaptive-demo/results.json   # prints, writes goals.json beside it

For every load point (the Poisson sweep, then the bursty trace):

- best fixed = the fixed configuration (target-only = k 0, tandem-kN) with the
  lowest mean latency over all runs, in hindsight;
- each adaptive policy's distance to it, pooled (mean over all its requests)
  and per run: run r of the policy against run r of the best fixed, which the
  interleaved bench sent minutes apart, so the machine's drift between runs
  cancels; the spread of the per-run distances is the noise a single run has.

Goals: every policy within 5 % of the best fixed k at every load;
at the highest load never more than 5 % worse than target-only; on the bursty
trace at least one policy better than every fixed k.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

MARGIN = 0.05


def _is_fixed(name: str) -> bool:
    return name == "target-only" or name.startswith("tandem-k")


def _runs(row: dict) -> list[float]:
    return row.get("latency_mean_by_run_s") or [row["summary"]["latency_s"]["mean"]]


def applies(results: dict) -> bool:
    """Does the run compare adaptive policies with fixed configurations under load?"""
    names = {n for per in (results.get("sweep") or {}).values() for n in per}
    return any(n.startswith("policy:") for n in names) and any(_is_fixed(n) for n in names)


def load_goals(per_config: dict) -> dict:
    """Best fixed configuration and each policy's pooled and per-run distance to it at one load."""
    means = {n: r["summary"]["latency_s"]["mean"] for n, r in per_config.items()}
    fixed = {n: m for n, m in means.items() if _is_fixed(n)}
    best = min(fixed, key=fixed.get)
    out = {"best_fixed": best, "best_fixed_latency_s": fixed[best], "policies": {}}
    for name, mean in means.items():
        if _is_fixed(name):
            continue
        runs, best_runs = _runs(per_config[name]), _runs(per_config[best])
        paired = [p / b - 1 for p, b in zip(runs, best_runs)]
        plain = means.get("target-only")
        out["policies"][name] = {
            "latency_s": mean,
            "vs_best_fixed": mean / fixed[best] - 1,
            "vs_best_fixed_by_run": paired,
            "vs_target_only": None if plain is None else mean / plain - 1,
            "beats_every_fixed": all(mean < m for m in fixed.values()),
        }
    return out


def goals(results: dict) -> dict:
    sweep = results.get("sweep") or {}
    loads = {load: load_goals(per) for load, per in sweep.items()}
    highest = max(sweep, key=lambda load: float(load.split("=")[1])) if sweep else None
    bursty = {load: load_goals(per) for load, per in (results.get("bursty") or {}).items()}
    policies = sorted({p for g in [*loads.values(), *bursty.values()] for p in g["policies"]})
    verdict = {}
    for p in policies:
        within = [g["policies"][p]["vs_best_fixed"] <= MARGIN for g in loads.values() if p in g["policies"]]
        top = loads[highest]["policies"].get(p) if highest else None
        verdict[p] = {
            "loads_within_5pct_of_best_fixed": f"{sum(within)}/{len(within)}",
            "highest_load_within_5pct_of_target_only": None if top is None or top["vs_target_only"] is None
            else top["vs_target_only"] <= MARGIN,
            "bursty_beats_every_fixed": any(g["policies"].get(p, {}).get("beats_every_fixed") for g in bursty.values()),
        }
    return {"margin": MARGIN, "sweep": loads, "bursty": bursty, "highest_load": highest, "verdict": verdict}


def table(g: dict) -> Table:
    t = Table(title="distance to the best fixed k: pooled (per run, min .. max)")
    t.add_column("load")
    t.add_column("best fixed")
    policies = list(g["verdict"])
    for p in policies:
        t.add_column(p, justify="right")
    for phase in ("sweep", "bursty"):
        for load, lg in g[phase].items():
            cells = []
            for p in policies:
                pg = lg["policies"].get(p)
                if pg is None:
                    cells.append("–")
                    continue
                runs = pg["vs_best_fixed_by_run"]
                spread = f" ({min(runs):+.1%} .. {max(runs):+.1%})" if len(runs) > 1 else ""
                cells.append(f"{pg['vs_best_fixed']:+.1%}{spread}")
            t.add_row(load, f"{lg['best_fixed']} {lg['best_fixed_latency_s']:.2f} s", *cells)
    return t


def main(results: Path = typer.Argument(..., help="A bench-adaptive results.json.")) -> None:
    g = goals(json.loads(results.read_text()))
    console = Console(width=200)
    console.print(table(g))
    for p, v in g["verdict"].items():
        console.print(f"{p}: {v}")
    out = results.parent / "goals.json"
    out.write_text(json.dumps(g, indent=2) + "\n")
    console.print(f"written to {out}")


if __name__ == "__main__":
    typer.run(main)
