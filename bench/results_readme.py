"""README.md of a results folder, generated from its results.json (the harness writes it after every run).

    python -m bench.results_readme bench/results/serving-demo [...]     # regenerate from results.json

Command, machine, date, then one table per phase (batch 1, each load point of the sweep, the
closed loop, the mix and the bursty trace): per configuration, requests, throughput, mean and p99
latency, TTFT, TPOT, SLO attainment and tokens per verify step; then the plots. Nothing is
written by hand: a newer run of the same name replaces the folder's files, git keeps the history.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from bench import prefill_chunk_report

PHASES = (("batch1", "Batch 1"), ("sweep", "Open loop (Poisson)"), ("closed", "Closed loop"), ("mix", "SLO mix"),
          ("bursty", "Bursty trace"))  # fmt: skip


def _f(x, spec: str = ".2f", scale: float = 1.0) -> str:
    return "–" if x is None else format(x * scale, spec)


def _row(config: str, s: dict) -> str:
    lat, ttft, tpot = s.get("latency_s") or {}, s.get("ttft_s") or {}, s.get("tpot_s") or {}
    return (f"| {config} | {s.get('num_ok', '–')}/{s.get('num_requests', '–')} | {_f(s.get('throughput_tok_s'), '.1f')} | "
            f"{_f(lat.get('mean'))} | {_f(lat.get('p99'))} | {_f(ttft.get('mean'), '.0f', 1e3)} | "
            f"{_f(tpot.get('mean'), '.1f', 1e3)} | {_f(s.get('attainment'))} | {_f(s.get('mean_accepted_length'))} |")


HEADER = ("| config | ok/requests | tok/s | latency mean (s) | latency p99 (s) | TTFT (ms) | TPOT (ms) | SLO attained | "
          "tokens/step |\n|---|---|---|---|---|---|---|---|---|")


def render(results: dict) -> str:
    started = results.get("started_unix")
    date = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if started else "unknown"
    m = results.get("machine") or {}
    machine = ", ".join(str(m[k]) for k in ("platform", "cpu_count", "torch") if k in m) if isinstance(m, dict) else m
    cpu = f"; {m['cpu_model']}" if isinstance(m, dict) and m.get("cpu_model") else ""
    lines = [f"# {results.get('name', 'results')}", "", f"Command: `{results.get('command', '?')}`  ",
             f"Machine: {machine} (CPUs, torch){cpu}  ", f"Date: {date}; duration {_f(results.get('duration_s'), '.0f')} s; commit {results.get('commit') or 'unknown'}  ",
             f"Models: {(results.get('models') or {}).get('target')} / {(results.get('models') or {}).get('draft')}", ""]
    for note in results.get("notes") or []:
        lines.append(f"Note: {note}  ")
    for key, title in PHASES:
        phase = results.get(key)
        if not phase:
            continue
        if key == "batch1":
            lines += ["", f"## {title}", "", HEADER, *(_row(c, row["summary"]) for c, row in phase.items())]
            continue
        for load, configs in phase.items():
            if not isinstance(configs, dict):
                continue
            rows = [_row(c, row["summary"]) for c, row in configs.items() if isinstance(row, dict) and "summary" in row]
            if rows:
                lines += ["", f"## {title}: {load}", "", HEADER, *rows]
    lines += prefill_chunk_report.section(results)
    plots = results.get("plots") or []
    if plots:
        lines += ["", "## Plots", "", *(f"![{p}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"


def write(folder: Path) -> Path:
    results = json.loads((folder / "results.json").read_text())
    out = folder / "README.md"
    out.write_text(render(results))
    return out


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(write(Path(arg)))
