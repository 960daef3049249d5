"""Plots of a gpu-bench run's results (the harness draws bench-slo's and bench-faser's itself).

    python -m bench.gpu.plots bench/results/gpu-bench-h100      (or the run's work directory)

verify_curve.png   T(N) per model and backend, B marked
decode.png         decode tok/s per batch size: HF generate and Tandem per backend
sm_split.png       draft and target step times per mode, the pipelined round vs serial SD
Each is drawn from its JSON when that exists; a missing one is skipped.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(folder: Path, name: str) -> dict | None:
    path = folder / name
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def verify_curve(data: dict, out: Path, plt) -> Path:
    models = list(dict.fromkeys(c["model"] for c in data["curves"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for c in (c for c in data["curves"] if c["model"] == model):
            n = [p[0] for p in c["sweep"]]
            t = [p[1] * 1e3 for p in c["sweep"]]
            line = ax.plot(n, t, marker="o", ms=3, label=f"{c['backend']} (B = {c['budget']}, {c['method']})")[0]
            ax.axvline(c["budget"], color=line.get_color(), ls=":", lw=1)
        ax.set_title(model)
        ax.set_xlabel("batched verify tokens N")
        ax.set_ylabel("verify forward (ms)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def decode(data: dict, out: Path, plt) -> Path:
    batches = sorted({r["batch"] for r in data["rows"]})
    backends = list(dict.fromkeys(r["backend"] for r in data["rows"]))
    series = {"HF generate": [next(r["hf_tok_s"] for r in data["rows"] if r["batch"] == b) for b in batches]}
    for be in backends:
        series[f"Tandem {be}"] = [next((r["tandem_tok_s"] for r in data["rows"] if r["batch"] == b and r["backend"] == be),
                                       0.0) for b in batches]  # fmt: skip
    fig, ax = plt.subplots(figsize=(6.5, 4))
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(batches))], values, width, label=label)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    ax.set_ylabel("decode tokens / s")
    ax.set_yscale("log")
    ax.set_title(f"{data['model']} ({data['dtype']}), {data['new_tokens']} new tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def sm_split(data: dict, out: Path, plt) -> Path:
    modes = data["modes"]
    names = [m["mode"] for m in modes]
    fig, ax = plt.subplots(figsize=(7, 4))
    x = range(len(modes))
    ax.bar([i - 0.2 for i in x], [m["draft_ms"] for m in modes], 0.4, label="draft step (chain of 4, batch 8)")
    ax.bar([i + 0.2 for i in x], [m["target_ms"] for m in modes], 0.4, label="target verify (root + 4, batch 8)")
    alone = next((m for m in modes if m["mode"] == "alone"), None)
    if alone:
        ax.axhline(alone["draft_ms"] + alone["target_ms"], color="k", ls="--", lw=1, label="serial SD round (alone)")
    ax.set_xticks(list(x), names, rotation=15)
    ax.set_ylabel("median step (ms); a pipelined round = max of the two")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def draw(folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for name, fn in (("verify_curve", verify_curve), ("decode", decode), ("sm_split", sm_split)):
        data = _load(folder, f"{name}.json")
        if not data or not (data.get("curves") or data.get("rows") or data.get("modes")):
            continue
        try:
            made.append(fn(data, folder / f"{name}.png", plt))
        except (KeyError, ValueError, TypeError, StopIteration) as exc:
            print(f"{name}: not drawn ({type(exc).__name__}: {exc})")
    return made


if __name__ == "__main__":
    for p in draw(Path(sys.argv[1])):
        print(p)
