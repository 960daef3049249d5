"""Host work per target step, eager forward vs the static (graph) path: ``python -m bench.host_overhead``.

A 30-layer, hidden-64 Llama does almost no arithmetic, so what a step costs on it
is host work: the part of a step that a GPU does not speed up. Per step of
``TargetEngine.step`` (one thread) this prints

    ops_outside    aten ops dispatched outside the region a CUDA graph replays (all of them, eager)
    syncs          host reads of device tensors and blocking host-to-device copies
    python_calls   Python function calls outside that region
    ms             median step time (no counters attached)

for plain decode, a 4-token chain and a 6-node tree, at batch 1 and 16, and per
``DraftEngine.speculate`` of a greedy 4-token draft chain (``draft4``: four draft
forwards) and a beam of depth 3 and width 2 (``beam6``: three forwards; the static
paths run them in one body, draft_chain_step.py, draft_tree_step.py), both paths
interleaved in each repeat (``shared/profiling/host_work.py`` says how each is counted;
on CPU the static path's body runs eagerly inside ``graph_body()``). ``--json`` prints
one JSON object with a list of rows.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.runner import ModelRunner
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem
from shared.profiling.host_work import HostWorkCounter, engine_device_tensors

SHAPES = {  # op -> tree parents
    "decode": [],
    "chain4": [-1, 0, 1, 2],
    "tree6": [-1, -1, 0, 0, 1, 2],
}
DRAFT_OPS = {"draft4": dict(chain_len=4), "beam6": dict(tree_depth=3, tree_width=2)}  # op -> the speculate shape
CONTEXT = 64


def hollow_llama(layers: int = 30, hidden: int = 64, vocab: int = 49152, seed: int = 0):
    """A Llama with real depth and almost no width: a step's cost is its host work."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).eval()


def make_engine(model, static: bool, batch: int, kind=TargetEngine):
    """A target (or, with ``kind=DraftEngine``, a draft) on a copy of ``model``, ``batch`` sequences prefilled."""
    config = EngineConfig(num_blocks=batch * 16 + 64, static_step=static, cpu_prepack=False)
    engine = kind(ModelRunner(copy.deepcopy(model), config))
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, engine.runner.vocab_size, (batch, CONTEXT), generator=g).tolist()
    engine.prefill([PrefillItem(seq_id=f"s{i}", prompt_ids=p) for i, p in enumerate(prompts)])
    return engine


def draft_call(engine: DraftEngine, op: str, batch: int, g: torch.Generator, last: list) -> None:
    """One speculate call: the target kept the first node of each last draft and added a bonus token."""
    bonus = torch.randint(0, engine.runner.vocab_size, (batch,), generator=g).tolist()
    items = [SpecItem(f"s{i}", last[i][:1] + [bonus[i]], **DRAFT_OPS[op]) for i in range(batch)]
    last[:] = [t.token_ids for t in engine.speculate(items)]


def measure_draft(engine: DraftEngine, op: str, batch: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(2)
    last: list = [[] for _ in range(batch)]
    draft_call(engine, op, batch, g, last)  # warm
    return counted(engine, lambda: draft_call(engine, op, batch, g, last), steps)


def counted(engine, call, steps: int) -> dict:
    """One ``call()`` under the host-work counters, then ``steps`` timed ones (no counters attached)."""
    with HostWorkCounter(engine_device_tensors(engine.runner)) as counter:
        call()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - t0))
    return {
        "ops_outside": counter.ops,
        "syncs": counter.num_syncs,
        "python_calls": counter.calls,
        "ms": statistics.median(times),
        "sync_sites": dict(counter.syncs.most_common(8)),
    }


def step_items(engine: TargetEngine, op: str, batch: int, g: torch.Generator) -> list[VerifyItem]:
    parents = SHAPES[op]
    tokens = torch.randint(0, engine.runner.vocab_size, (batch, len(parents)), generator=g).tolist()
    return [VerifyItem(seq_id=f"s{i}", tree=TokenTree(token_ids=tokens[i], parent_ids=list(parents))) for i in range(batch)]


def measure(engine: TargetEngine, op: str, batch: int, steps: int) -> dict:
    g = torch.Generator().manual_seed(2)
    engine.step([], step_items(engine, op, batch, g))  # warm
    items = [step_items(engine, op, batch, g) for _ in range(steps + 1)]  # built before the clock and counters
    return counted(engine, lambda: engine.step([], items.pop(0)), steps)


def run(batches: list[int], ops: list[str], repeats: int, steps: int) -> list[dict]:
    torch.set_num_threads(1)
    model = hollow_llama()
    rows: dict[tuple, dict] = {}
    for rep in range(repeats):
        for batch in batches:
            engines = {path: make_engine(model, path == "graph", batch) for path in ("eager", "graph")}
            drafts = {}
            if any(op in DRAFT_OPS for op in ops):
                drafts = {path: make_engine(model, path == "graph", batch, DraftEngine) for path in ("eager", "graph")}
            for op in ops:
                for path in ("eager", "graph"):  # interleaved: both paths on the same machine moment
                    if op in DRAFT_OPS:
                        m = measure_draft(drafts[path], op, batch, steps)
                    else:
                        m = measure(engines[path], op, batch, steps)
                    key = (path, op, batch)
                    row = rows.setdefault(key, {"path": path, "op": op, "batch": batch, "ms_repeats": []})
                    row.update({k: v for k, v in m.items() if k != "ms"})
                    row["ms_repeats"].append(round(m["ms"], 3))
    out = []
    for row in rows.values():
        row["ms"] = round(statistics.median(row["ms_repeats"]), 3)
        out.append(row)
    return out


def goals(row: dict) -> dict:
    """The verify-step goals (a draft call's k forwards are held to one sync only)."""
    b = row["batch"]
    if row["op"] in DRAFT_OPS:
        return {"syncs": row["syncs"] == 1}
    return {
        "ops": row["ops_outside"] <= 100 + 10 * b,
        "syncs": row["syncs"] == 1,
        "calls": row["python_calls"] <= 300 + 30 * b,
    }


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    return f"{model}, {torch.get_num_threads()} thread, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.host_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--ops", default="decode,chain4,tree6,draft4,beam6")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per measurement (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", help="also write results.json and README.md to this folder")
    args = parser.parse_args(argv)
    try:
        batches = [int(x) for x in args.batches.split(",")]
        ops = [x for x in args.ops.split(",")]
        bad = [o for o in ops if o not in SHAPES and o not in DRAFT_OPS]
        if bad or any(b < 1 for b in batches) or args.repeats < 1 or args.steps < 1:
            raise ValueError(f"unknown ops {bad}" if bad else "batches, repeats and steps must be >= 1")
    except ValueError as exc:
        parser.error(str(exc))
    rows = run(batches, ops, args.repeats, args.steps)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {
        "command": "python -m bench.host_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
    }
    if args.out:
        write_results(Path(args.out), meta, rows)
    if args.json:
        print(json.dumps({**meta, "rows": rows}, indent=1))
        return 0
    print("\n".join(table(meta, rows)))
    return 0


def table(meta: dict, rows: list[dict]) -> list[str]:
    lines = [f"`{meta['command']}` ({meta['machine']}, {meta['date']}, commit {meta['commit']})", "",
             "| path | op | B | ops outside | syncs | Python calls | ms (median) | ms per repeat | goals ops / syncs / calls |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["batch"], r["op"], r["path"])):
        g = goals(r)
        marks = " / ".join(("met" if g[k] else "no") if k in g else "-" for k in ("ops", "syncs", "calls"))
        lines.append(f"| {r['path']} | {r['op']} | {r['batch']} | {r['ops_outside']} | {r['syncs']} | {r['python_calls']} "
                     f"| {r['ms']:.2f} | {', '.join(f'{x:.2f}' for x in r['ms_repeats'])} | {marks} |")  # fmt: skip
    return lines


def write_results(folder: Path, meta: dict, rows: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    head = [
        "# Host work per engine step: eager forward vs the static (graph) path",
        "",
        "The 30-layer, hidden-64 Llama of `bench/host_overhead.py` (random weights, one thread): a step's cost is",
        "its host work. Goals per verify step: ops outside the captured body <= 100 + 10 B, host syncs = 1,",
        "Python calls <= 300 + 30 B. `draft4` is one draft call of a greedy 4-token chain (four draft forwards),",
        "`beam6` one of a beam of depth 3 and width 2 (three forwards); the static paths run them in one body",
        "(`shared/engine/draft_chain_step.py`, `draft_tree_step.py`), held to one host sync. On CPU the static path's body runs eagerly inside `graph_body()`, the",
        "region the CUDA path captures; ops and calls inside it are not counted (`shared/profiling/host_work.py`).",
        "Both paths run interleaved in each repeat; the sync sites of the eager path are in results.json.",
        "",
    ]
    (folder / "README.md").write_text("\n".join(head + table(meta, rows)) + "\n")


if __name__ == "__main__":
    sys.exit(main())
