"""`make bench-order`'s summary: mean and p99 latency per queue policy vs concurrent requests.

    order_summary(results)   {"concurrency=10": {"order:fcfs": {"mean_s", "p99_s", "mean_vs_fcfs"}, ...,
                              "replay": {"sjf_bound", "sjf_tokens", "sjf_steps", "model"}}, ...}
    write(results, out_dir)  order_summary.json + order_latency.png; the table on the console

``mean_vs_fcfs`` is the mean latency relative to FCFS at the same load
(0.75 = 25 % lower, LAPS-SD's goal); ``replayed_order_vs_fcfs`` (per repeat) the order the
policy admitted in, replayed on FCFS's work and costs (bench/order_replay.py: the order alone, without
the machine's drift between runs or what preemption changed); ``mean_tokens`` and
``bound_length_rank_corr`` (Spearman's ρ of max_new_tokens and the actual
length) tell how much a length predictor could know.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.order_replay import order_bounds, replayed_order

FCFS = "order:fcfs"


def order_summary(results: dict, slots: int | None = None) -> dict:
    """Per load: each policy's latency vs FCFS, and (``replay``) what orders could reach on ``slots`` batch slots
    (default TANDEM_MAX_BATCH_SIZE, else 4: bench-order's)."""
    slots = slots or int(os.environ.get("TANDEM_MAX_BATCH_SIZE", "4"))
    out: dict = {}
    for load, per_config in results.get("closed", {}).items():
        rows = {name: row["summary"]["latency_s"] for name, row in per_config.items()}
        lengths = {name: row["summary"].get("output_lengths") or {} for name, row in per_config.items()}
        base = (rows.get(FCFS) or {}).get("mean")
        out[load] = {
            name: {"mean_s": lat["mean"], "p99_s": lat["p99"],
                   "mean_vs_fcfs": lat["mean"] / base if base and lat["mean"] is not None else None,
                   "mean_tokens": lengths[name].get("mean_tokens"),
                   "bound_length_rank_corr": lengths[name].get("rank_corr")}
            for name, lat in rows.items()
        }  # fmt: skip
        fcfs = per_config.get(FCFS) or {}
        if fcfs and (bounds := order_bounds(fcfs.get("requests") or [], slots, fcfs.get("overhead"))):
            out[load]["replay"] = bounds
        for name, row in per_config.items():  # the order each policy chose, on FCFS's work: drift and preemption out
            if fcfs and (own := replayed_order(row.get("requests") or [], fcfs.get("requests") or [], slots,
                                               fcfs.get("overhead"))):  # fmt: skip
                out[load][name]["replayed_order_vs_fcfs"] = own
    return out


def write(results: dict, out_dir: Path, console: Console | None = None) -> dict:
    summary = order_summary(results)
    (out_dir / "order_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = Table(title="request order: end-to-end latency (closed loop)")
    for c in ("load", "policy", "mean s", "p99 s", "mean vs fcfs", "its order replayed", "tokens/req", "ρ(bound, len)"):
        table.add_column(c, justify="left" if c in ("load", "policy") else "right")
    for load, rows in summary.items():
        for name, r in rows.items():
            if name == "replay":
                continue
            fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
            own = r.get("replayed_order_vs_fcfs")
            table.add_row(load, name, fmt(r["mean_s"], ".2f"), fmt(r["p99_s"], ".2f"), fmt(r["mean_vs_fcfs"], ".2f"),
                          fmt(statistics.fmean(own) if own else None, ".2f"), fmt(r.get("mean_tokens"), ".1f"),
                          fmt(r.get("bound_length_rank_corr"), ".2f"))  # fmt: skip
    (console or Console()).print(table)
    for load, rows in summary.items():
        if bounds := rows.get("replay"):
            (console or Console()).print(f"{load}: FCFS's requests replayed shortest-first ({bounds['model']} model), "
                                         "vs FCFS: " + ", ".join(f"{k} {v:.2f}" for k, v in bounds.items()
                                                                if k != "model"))  # fmt: skip
    _plot(summary, out_dir / "order_latency.png")
    return summary


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted(summary, key=lambda s: int(s.split("=")[1]))
    names = list(dict.fromkeys(n for load in loads for n in summary[load] if n != "replay"))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name in names:
        xs = [int(load.split("=")[1]) for load in loads if name in summary[load]]
        for ax, key in zip(axes, ("mean_s", "p99_s")):
            ax.plot(xs, [summary[f"concurrency={x}"][name][key] for x in xs], marker="o", label=name)
    for ax, title in zip(axes, ("mean latency (s)", "p99 latency (s)")):
        ax.set_xlabel("concurrent requests")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
