"""The fused decoder against the transformers layers on this CPU: ``python -m bench.fused_layers``.

Two measurements, each with both paths built side by side in one process and timed forward by
forward in alternation (the order flipping every forward), so the machine's state, and other
load on it, falls on both alike:

* hollow: one ``ModelRunner.forward`` on a 30-layer, hidden-64 Llama (random weights, compute
  ~0: what is left is host work), one thread, batch 1: a decode (1 row) and the verify of a
  4-token chain (the bonus token + 4 nodes, 5 rows), rolled back after each so every forward
  sees the same 64-token context. Goal: fused >= 1.5x.
* smollm2: target-only decoding through ``TargetEngine.verify`` (empty trees: one token per
  sequence and step) on the prepared SmolLM2-135M-Instruct, batch 1 and 16 of the chat prompts,
  float32 and bfloat16, torch's default threads. Tokens/s = batch / median step time. The
  greedy tokens of both paths are compared. Goal: fused >= 1.1x.

Per repeat the median of its forwards; reported: the median over repeats and the spread
(min-max of the repeats' medians), and the ratio per repeat. Both paths use the same engine
configuration but ``fused_layers`` (cpu_prepack's row threshold measured once and given to both).
Results: bench/results/<name>/ (results.json, README.md).
"""

from __future__ import annotations

import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import typer

from bench.engine_bench import as_ids, encode
from bench.run_info import machine
from shared.engine.config import EngineConfig
from shared.engine.cpu_linear import PackedLinear
from shared.engine.runner import ModelRunner, Work
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem

app = typer.Typer(add_completion=False)

PATHS = ("transformers", "fused")
HOLLOW_GOAL, SMOLLM2_GOAL = 1.5, 1.1
CHAIN = [(100 + j, j - 1) for j in range(4)]  # a 4-token chain: (token, parent)
DEFAULT_THREADS = torch.get_num_threads()


def hollow_model(fused: bool, prepack_min_rows: int | None) -> ModelRunner:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=30,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval().requires_grad_(False)
    cfg = EngineConfig(num_blocks=64, block_size=16, fused_layers=fused, cpu_prepack_min_rows=prepack_min_rows)
    return ModelRunner(model, cfg)


def min_rows(runner: ModelRunner) -> int | None:
    """The row count from which the runner's packed weights are used (None: nothing packed)."""
    return next((m.min_rows for m in runner.lm_head.modules() if isinstance(m, PackedLinear)), None)


def summary(per_repeat: dict[str, list[float]], *, higher_is_better: bool = False) -> dict:
    """Medians and spreads of each path's per-repeat values, and the fused path's speed-up per repeat
    (transformers / fused for times, fused / transformers for rates)."""
    pairs = zip(per_repeat["transformers"], per_repeat["fused"])
    ratios = [f / t if higher_is_better else t / f for t, f in pairs]
    out = {p: {"median": statistics.median(v), "min": min(v), "max": max(v), "repeats": v} for p, v in per_repeat.items()}
    out["ratio"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "repeats": ratios}
    return out


def timed_alternating(calls: dict[str, callable], count: int) -> dict[str, list[float]]:
    """Each path's call ``count`` times, alternating (the first path flips every round); seconds per call."""
    times: dict[str, list[float]] = {p: [] for p in calls}
    for i in range(count):
        for p in (PATHS if i % 2 == 0 else PATHS[::-1]):
            start = time.perf_counter()
            calls[p]()
            times[p].append(time.perf_counter() - start)
    return times


def hollow(repeats: int, forwards: int) -> list[dict]:
    torch.set_num_threads(1)
    runners = {"transformers": hollow_model(False, None)}
    runners["fused"] = hollow_model(True, min_rows(runners["transformers"]))
    seqs = {p: r.add("hollow", list(range(2, 66))) for p, r in runners.items()}
    for p, r in runners.items():
        r.forward([Work(seqs[p], want_root=True)])

    def decode(p):
        return lambda: runners[p].forward([Work(seqs[p], want_root=True)])

    def chain4(p):
        def call():
            runners[p].forward([Work(seqs[p], new_nodes=CHAIN, want_root=True, want_nodes=True)])
            runners[p].commit(seqs[p], [])  # roll back: the same context every time

        return call

    rows = []
    for op, make in (("decode", decode), ("chain4", chain4)):
        calls = {p: make(p) for p in PATHS}
        timed_alternating(calls, 5)  # warm both
        per_repeat: dict[str, list[float]] = {p: [] for p in PATHS}
        for _ in range(repeats):
            for p, t in timed_alternating(calls, forwards).items():
                per_repeat[p].append(statistics.median(t) * 1e3)
        row = {"op": op, "batch": 1, "unit": "ms per forward", **summary(per_repeat)}
        rows.append(row)
        print(f"hollow {op}: transformers {row['transformers']['median']:.2f} ms, fused {row['fused']['median']:.2f} ms,"
              f" x{row['ratio']['median']:.2f} (repeats {', '.join(f'{x:.2f}' for x in row['ratio']['repeats'])})")  # fmt: skip
    torch.set_num_threads(DEFAULT_THREADS)
    return rows


def smollm2(model_dir: Path, dtypes: list[str], batches: list[int], repeats: int, steps: int) -> list[dict]:
    from shared.engine.factory import build_target_engine

    torch.set_num_threads(DEFAULT_THREADS)
    rows = []
    for dtype in dtypes:
        engines: dict[str, TargetEngine] = {}
        base, loaded = build_target_engine(model_dir, dtype=dtype, engine_config=EngineConfig(fused_layers=False))
        engines["transformers"] = base
        config = EngineConfig(fused_layers=True, cpu_prepack_min_rows=min_rows(base.runner))
        engines["fused"], _ = build_target_engine(model_dir, dtype=dtype, engine_config=config, with_tokenizer=False)
        for batch in batches:
            prompts = [as_ids(p) for p in encode(loaded.tokenizer, batch)]
            per_repeat: dict[str, list[float]] = {p: [] for p in PATHS}
            same = True
            for rep in range(repeats + 1):  # the first round warms both paths
                ids = [f"r{rep}-{i}" for i in range(batch)]
                tokens: dict[str, list[list[int]]] = {}
                for p, engine in engines.items():
                    firsts = engine.prefill([PrefillItem(s, q) for s, q in zip(ids, prompts)])
                    tokens[p] = [[r.first_token] for r in firsts]
                empty = TokenTree(token_ids=[], parent_ids=[])

                def step(p):
                    def call():
                        for out, res in zip(tokens[p], engines[p].verify([VerifyItem(s, empty) for s in ids])):
                            out.extend(res.tokens)

                    return call

                times = timed_alternating({p: step(p) for p in PATHS}, steps)
                for engine in engines.values():
                    engine.release(ids)
                same &= tokens["fused"] == tokens["transformers"]
                if rep:
                    for p in PATHS:
                        per_repeat[p].append(batch / statistics.median(times[p]))
            s = summary(per_repeat, higher_is_better=True)
            row = {"dtype": dtype, "batch": batch, "unit": "tokens/s", "steps": steps, "greedy_equal": same, **s}
            rows.append(row)
            print(f"smollm2 {dtype} batch {batch}: transformers {row['transformers']['median']:.1f} tok/s, fused "
                  f"{row['fused']['median']:.1f} tok/s, x{row['ratio']['median']:.2f} (repeats "
                  f"{', '.join(f'{x:.2f}' for x in row['ratio']['repeats'])}); greedy equal: {same}")  # fmt: skip
        del engines, base
        gc.collect()
    return rows


@app.command()
def main(
    repeats: int = typer.Option(3, min=3),
    forwards: int = typer.Option(40, min=3, help="Forwards per path and repeat (hollow)."),
    steps: int = typer.Option(16, min=3, help="Decode steps per path and repeat (smollm2)."),
    dtypes: str = typer.Option("float32,bfloat16"),
    batches: str = typer.Option("1,16"),
    skip_smollm2: bool = typer.Option(False, help="Only the hollow model."),
    name: str = typer.Option("fused-layers"),
    home: str = typer.Option(None),
) -> None:
    started = time.time()
    results = {"name": name, "command": "python -m bench.fused_layers " + " ".join(sys.argv[1:]),
               "started_unix": started, "repeats": repeats, "forwards": forwards,
               "goals": {"hollow": HOLLOW_GOAL, "smollm2": SMOLLM2_GOAL}}  # fmt: skip
    results["hollow"] = hollow(repeats, forwards)
    results["smollm2"] = []
    if not skip_smollm2:
        from shared.models import smollm2 as smollm2_model
        from shared.models.paths import Paths

        model_dir = smollm2_model.model_dir(Paths.resolve(home))
        results["target"] = str(model_dir)
        results["smollm2"] = smollm2(model_dir, dtypes.split(","), [int(b) for b in batches.split(",")], repeats, steps)
    results["machine"] = machine(DEFAULT_THREADS)
    results["lscpu"] = _output(["lscpu"]).splitlines()[:10]
    results["commit"] = _output(["git", "rev-parse", "--short", "HEAD"]).strip()
    results["duration_s"] = time.time() - started
    out = Path(__file__).resolve().parent / "results" / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "README.md").write_text(readme(results))
    print(f"results in {out}")


def _output(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def _cell(row: dict, path: str, digits: int) -> str:
    r = row[path]
    return f"{r['median']:.{digits}f} ({r['min']:.{digits}f}-{r['max']:.{digits}f})"


def readme(r: dict) -> str:
    """The results as README.md: command, machine, date, commit, one table per measurement."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(r["started_unix"]))
    ratios = lambda row: ", ".join(f"{x:.2f}" for x in row["ratio"]["repeats"])  # noqa: E731
    lines = [f"# {r['name']}", "", "The fused decoder (shared/engine/fused) against transformers' layers, side by side in "
             "one process, timed forward by forward in alternation (bench/fused_layers.py).", "",
             f"Command: `{r['command']}`  ", f"Date: {when}; commit {r.get('commit', '?')}; duration "
             f"{r['duration_s']:.0f} s; {r['repeats']} repeats, medians (min-max over the repeats' medians)  ",
             f"Machine: torch {r['machine']['torch']}, transformers {r['machine']['transformers']}, load average at the "
             f"end {', '.join(f'{x:.1f}' for x in r['machine']['load_average_at_end'])}", "", "```",
             *r.get("lscpu", []), "```", "",
             f"## Hollow 30-layer hidden-64 Llama, one thread, batch 1 (goal: fused >= {r['goals']['hollow']}x)", "",
             f"ms per `ModelRunner.forward`, {r['forwards']} forwards per path and repeat:", "",
             "| op | transformers | fused | speed-up | per repeat |", "|---|---|---|---|---|"]  # fmt: skip
    for row in r["hollow"]:
        lines.append(f"| {row['op']} | {_cell(row, 'transformers', 2)} | {_cell(row, 'fused', 2)} | "
                     f"{row['ratio']['median']:.2f}x | {ratios(row)} |")  # fmt: skip
    if r["smollm2"]:
        lines += ["", f"## SmolLM2-135M-Instruct target-only decode (goal: fused >= {r['goals']['smollm2']}x)", "",
                  f"tokens/s through `TargetEngine.verify` with empty trees, {r['smollm2'][0]['steps']} steps per path "
                  "and repeat, torch's default threads; greedy: the two paths' tokens compared:", "",
                  "| dtype | batch | transformers | fused | speed-up | per repeat | greedy equal |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in r["smollm2"]:
            lines.append(f"| {row['dtype']} | {row['batch']} | {_cell(row, 'transformers', 1)} | {_cell(row, 'fused', 1)} "
                         f"| {row['ratio']['median']:.2f}x | {ratios(row)} | {row['greedy_equal']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    app()
