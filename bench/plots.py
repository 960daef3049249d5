"""PNG figures of a results dict (matplotlib, Agg backend: no display needed).

    batch1_throughput.png     tokens/s per configuration at batch 1
    load_<phase>.png          latency p50/p99, goodput and SLO attainment vs request rate (sweep),
                              concurrency (closed) or share of stringent requests (mix)
    acceptance.png            accepted draft tokens per step (histogram), per configuration
    position_acceptance.png   acceptance by draft position, per configuration
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def batch1_throughput(results: dict, out: Path) -> Path | None:
    rows = results.get("batch1") or {}
    if not rows:
        return None
    names = list(rows)
    values = [rows[n]["summary"]["throughput_tok_s"] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bars = ax.bar(names, values, color=["tab:gray" if n.startswith("hf") else "tab:blue" for n in names])
    ax.bar_label(bars, fmt="%.1f")
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title(f"{results['pair']}: decoding throughput at batch 1")
    ax.tick_params(axis="x", rotation=20)
    return _save(fig, out / "batch1_throughput.png")


def load_curves(results: dict, phase: str, out: Path) -> Path | None:
    data = results.get(phase) or {}
    if not data:
        return None
    loads = list(data)
    xs = [float(x.split("=")[1]) for x in loads]
    configs = list(dict.fromkeys(c for per in data.values() for c in per))  # first-seen order
    xlabel = {"sweep": "request rate (req/s)", "closed": "concurrency", "mix": "share of stringent requests"}[phase]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name in configs:
        pts = [(x, data[load][name]["summary"]) for x, load in zip(xs, loads) if name in data[load]]
        px = [p[0] for p in pts]
        axes[0].plot(px, [s["latency_s"]["p50"] for _, s in pts], marker="o", label=f"{name} p50")
        axes[0].plot(px, [s["latency_s"]["p99"] for _, s in pts], marker="x", linestyle="--", alpha=0.6)
        axes[1].plot(px, [s["goodput_tok_s"] for _, s in pts], marker="o", label=name)
        axes[2].plot(px, [s["attainment"] for _, s in pts], marker="o", label=name)
    axes[0].set_ylabel("end-to-end latency (s), p50 — / p99 --")
    axes[1].set_ylabel("goodput (tokens/s of SLO-meeting requests)")
    axes[2].set_ylabel("SLO attainment")
    axes[2].set_ylim(0, 1.05)
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{results['pair']}: {phase} (baseline TPOT {results['baseline_tpot_ms']:.1f} ms)")
    return _save(fig, out / f"load_{phase}.png")


def acceptance_hist(results: dict, out: Path) -> Path | None:
    rows = {n: r for n, r in (results.get("batch1") or {}).items() if r["summary"].get("mean_accepted_length")}
    rows = {n: r for n, r in rows.items() if r["summary"]["accepted_per_step_hist"] and n != "hf-target"}
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 3.2), squeeze=False)
    for ax, (name, row) in zip(axes[0], rows.items()):
        hist = {int(k): v for k, v in row["summary"]["accepted_per_step_hist"].items()}
        total = sum(hist.values()) or 1
        ks = list(range(max(hist) + 1))
        ax.bar(ks, [hist.get(k, 0) / total for k in ks])
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("accepted draft tokens per step")
    axes[0][0].set_ylabel("share of steps")
    fig.suptitle(f"{results['pair']}: acceptance per step, batch 1")
    return _save(fig, out / "acceptance.png")


def position_acceptance(results: dict, out: Path) -> Path | None:
    rows = {n: r["per_position_acceptance"] for n, r in (results.get("batch1") or {}).items()
            if r.get("per_position_acceptance")}  # fmt: skip
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, positions in rows.items():
        ax.plot([p["position"] for p in positions], [p["rate"] for p in positions], marker="o", label=f"{name}")
        cond = [(p["position"], p["conditional_rate"]) for p in positions if p["conditional_rate"] is not None]
        ax.plot([c[0] for c in cond], [c[1] for c in cond], linestyle=":", alpha=0.6)
    ax.set_xlabel("draft position (0 = first drafted token)")
    ax.set_ylabel("accepted / proposed  (dotted: given previous accepted)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{results['pair']}: per-position acceptance, batch 1")
    return _save(fig, out / "position_acceptance.png")


def all_plots(results: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = [
        batch1_throughput(results, out),
        load_curves(results, "sweep", out),
        load_curves(results, "closed", out),
        load_curves(results, "mix", out),
        acceptance_hist(results, out),
        position_acceptance(results, out),
    ]
    return [p for p in made if p is not None]
