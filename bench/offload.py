"""`make bench-offload`: the draft offload (Nightjar §5.1, elastic memory) under a deliberately small KV pool.

    pool_env(models)          TANDEM_* for both stacks: a small target pool, what the draft's footprint is worth
    Timeline(metrics_url)     samples the scheduler's KV budget, offload state and load while a run goes
    write(results, out_dir)   offload_summary.json + offload.png; the table on the console

Two stacks, identical but for TANDEM_DRAFT_OFFLOAD (configurations ``offload:on`` and ``offload:off``), a
speculation policy that stops drafting under load (SmartSpec), closed-loop load well beyond what the small
pool admits. With offload on, the scheduler offloads the draft once nothing speculates under KV pressure, the
target's pool grows by the draft's footprint (TANDEM_KV_GROW_BLOCKS) and the token budget with it, so more
requests run per step; with it off the pool stays small.

What the draft is worth: its weights in the served dtype plus its own KV pool, in target KV blocks. On a GPU
that is the memory the pair shares; on CPU nothing moves (the weights stay in host memory), so the run
emulates a device the pair shares: the target is granted the space the draft would give back.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import prom

BLOCK_SIZE = 16
MAX_BATCH_SIZE = 8
MAX_PROMPT_TOKENS = 192
MAX_NEW_TOKENS = 32
BASE_REQUESTS = 3  # requests of the largest size the small pool's budget holds
SPARE_K = 32  # what services.scheduler.main.kv_token_budget sets aside per batch slot beyond a block
DTYPE_BYTES = {"float32": 4, "auto": 4, "bfloat16": 2, "float16": 2}


def pool_blocks() -> int:
    """Blocks of the small pool: BASE_REQUESTS of the largest request, plus the scheduler's spare per batch slot."""
    tokens = BASE_REQUESTS * (MAX_PROMPT_TOKENS + MAX_NEW_TOKENS) + MAX_BATCH_SIZE * (BLOCK_SIZE + SPARE_K)
    return math.ceil(tokens / BLOCK_SIZE)


def draft_footprint_blocks(target_dir: Path, draft_dir: Path, dtype: str, num_blocks: int) -> int:
    """The draft's weights (served dtype) and KV pool of ``num_blocks``, in target KV blocks (floor)."""
    size = DTYPE_BYTES.get(dtype, 4)
    draft_bytes = _num_params(draft_dir) * size + num_blocks * _block_bytes(draft_dir, size)
    return draft_bytes // _block_bytes(target_dir, size)


def pool_env(target_dir: Path, draft_dir: Path | None, dtype: str) -> dict[str, str]:
    """The settings both stacks launch with (only TANDEM_DRAFT_OFFLOAD differs, per configuration)."""
    num_blocks = pool_blocks()
    grow = draft_footprint_blocks(target_dir, draft_dir, dtype, num_blocks) if draft_dir is not None else 0
    return {"TANDEM_BLOCK_SIZE": str(BLOCK_SIZE), "TANDEM_NUM_BLOCKS": str(num_blocks),
            "TANDEM_KV_GROW_BLOCKS": str(grow), "TANDEM_MAX_BATCH_SIZE": str(MAX_BATCH_SIZE)}  # fmt: skip


def _config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def _block_bytes(model_dir: Path, dtype_bytes: int) -> int:
    cfg = _config(model_dir)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * BLOCK_SIZE * kv_heads * head_dim * dtype_bytes


def _num_params(model_dir: Path) -> int:
    """Parameters in the model's safetensors files (headers only, nothing loaded)."""
    from safetensors import safe_open

    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            total += sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
    return total


class Timeline:
    """Samples /metrics every ``interval_s`` during a run: KV token budget, draft offloaded, running, waiting."""

    def __init__(self, metrics_url: str | None, interval_s: float = 0.25) -> None:
        self.url = metrics_url
        self.interval_s = interval_s
        self.samples: list[dict] = []

    async def __aenter__(self) -> Timeline:
        self._t0 = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def __aexit__(self, *exc) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._sample()

    async def _run(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.interval_s)

    async def _sample(self) -> None:
        if not self.url:
            return
        t = time.perf_counter() - self._t0
        s = await asyncio.to_thread(prom.scrape, self.url)
        self.samples.append({
            "t_s": round(t, 3),
            "kv_token_budget": s.get(("tandem_kv_budget_tokens", ())) or None,  # 0 before the first step
            "draft_offloaded": bool(s.get(("tandem_draft_offloaded", ()))),
            "running": int(s.get(("tandem_running_requests", ()), 0)),
            "waiting": int(s.get(("tandem_queue_depth", (("queue", "all"),)), 0)),
        })  # fmt: skip


def offload_summary(results: dict) -> dict:
    """Per load: each configuration's throughput, latency, offload/reload and pool events, budget range; on / off."""
    loads: dict = {}
    for load, per_config in results.get("closed", {}).items():
        configs = {name: _row(row) for name, row in per_config.items()}
        on, off = configs.get("offload:on"), configs.get("offload:off")
        ratio = on["throughput_tok_s"] / off["throughput_tok_s"] if on and off and off["throughput_tok_s"] else None
        loads[load] = {"configs": configs, "throughput_on_vs_off": ratio}
    return {"loads": loads}


def _row(row: dict) -> dict:
    s, timeline = row["summary"], row.get("timeline") or []
    budgets = [p["kv_token_budget"] for p in timeline if p["kv_token_budget"]]
    events = row.get("memory_events") or {}
    return {
        "throughput_tok_s": s["throughput_tok_s"],
        "mean_latency_s": s["latency_s"]["mean"],
        "p99_latency_s": s["latency_s"]["p99"],
        "num_ok": s.get("num_ok"),
        "offloads": events.get("offload", 0),
        "reloads": events.get("reload", 0),
        "pool_events": {k: v for k, v in events.items() if k not in ("offload", "reload")},
        "kv_token_budget": {"min": min(budgets), "max": max(budgets)} if budgets else None,
        "share_offloaded": sum(p["draft_offloaded"] for p in timeline) / len(timeline) if timeline else None,
    }


def write(results: dict, out_dir: Path, *, pool: dict[str, str] | None = None, console: Console | None = None) -> dict:
    """``pool``: the TANDEM_* settings the stacks ran with (pool_env, or what the environment overrode)."""
    summary = offload_summary(results) | {"pool": pool}
    (out_dir / "offload_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = Table(title=f"draft offload under a small KV pool ({summary['pool']})")
    for c in ("load", "config", "tok/s", "mean s", "p99 s", "offloads", "reloads", "budget min..max", "offloaded",
              "on / off"):  # fmt: skip
        table.add_column(c, justify="left" if c in ("load", "config") else "right")
    fmt = lambda v, f: "–" if v is None else format(v, f)  # noqa: E731
    for load, entry in summary["loads"].items():
        for name, r in entry["configs"].items():
            b = r["kv_token_budget"]
            ratio = fmt(entry["throughput_on_vs_off"], ".2f") if name == "offload:on" else ""
            table.add_row(load, name, fmt(r["throughput_tok_s"], ".1f"), fmt(r["mean_latency_s"], ".2f"),
                          fmt(r["p99_latency_s"], ".2f"), str(r["offloads"]), str(r["reloads"]),
                          f"{b['min']:.0f}..{b['max']:.0f}" if b else "–", fmt(r["share_offloaded"], ".0%"), ratio)  # fmt: skip
    (console or Console()).print(table)
    _plot(results, summary["loads"], out_dir / "offload.png")
    return summary


def _plot(results: dict, loads_summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = sorted(loads_summary, key=lambda s: int(s.split("=")[1]))
    names = list(dict.fromkeys(n for load in loads for n in loads_summary[load]["configs"]))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for name in names:
        xs = [int(load.split("=")[1]) for load in loads if name in loads_summary[load]["configs"]]
        rows = [loads_summary[f"concurrency={x}"]["configs"][name] for x in xs]
        axes[0].plot(xs, [r["throughput_tok_s"] for r in rows], marker="o", label=name)
        axes[1].plot(xs, [r["mean_latency_s"] for r in rows], marker="o", label=name)
        if loads:  # the KV budget over time at the highest load
            timeline = results["closed"][loads[-1]].get(name, {}).get("timeline") or []
            points = [(p["t_s"], p["kv_token_budget"]) for p in timeline if p["kv_token_budget"]]
            if points:
                axes[2].step(*zip(*points), where="post", label=name)
    titles = (("concurrent requests", "throughput (tok/s)"), ("concurrent requests", "mean latency (s)"),
              ("time in run (s)", f"KV token budget ({loads[-1] if loads else '-'})"))  # fmt: skip
    for ax, (xlabel, title) in zip(axes, titles):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
