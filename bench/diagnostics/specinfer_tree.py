"""SpecInfer's tree <1,1,3,1,1,1,1,1> cut out of a beam (before 2026-12-01) against drafted node by node (now).

    python -m bench.diagnostics.specinfer_tree            # the demo pair (its distilled model draft) on chat prompts, greedy

Each step drafts both trees from the same context: a beam of depth 8 and width 3 with the expansion cut out
of it (``select_expansion``), and the expansion itself (``SpecShape.expanded``); the target verifies the
expansion (greedy). The cut is a subtree of the expansion (within one parent a beam keeps children by
their conditional probability), so the draft tokens it would have had accepted are the longest prefix of
the verified path that it holds: both counted exactly at the same context. No timing: what differs is
the tree.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import typer

from bench.exit_signal import PROMPTS
from bench.run_info import machine
from scheduler.policies.adaserve import SPECINFER_EXPANSION
from scheduler.policies.selection import select_expansion, subtree
from scheduler.spec_shape import SpecShape
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.types import PrefillItem, SpecItem, VerifyItem
from shared.models.paths import Paths
from shared.models.registry import get_pair

OUT = Path("bench/results/diag-specinfer-tree")


def matched(tree, path: list[int]) -> int:
    """How many tokens of ``path`` a root path of ``tree`` holds (its greedy accepted length)."""
    node, n = -1, 0
    for token in path:
        node = next((j for j, (t, p) in enumerate(zip(tree.token_ids, tree.parent_ids)) if p == node and t == token), None)
        if node is None:
            break
        n += 1
    return n


def main(
    batch: int = typer.Option(4, help="Prompts (sequences per set)."),
    steps: int = typer.Option(24, help="Speculation steps per sequence."),
    dtype: str = typer.Option("bfloat16", help="Weights of both models."),
    threads: int = typer.Option(2, help="torch threads."),
    home: str = typer.Option(None, help="Tandem home (default ~/.cache/tandem)."),
) -> None:
    torch.set_num_threads(threads)
    started = time.time()
    paths = Paths.resolve(home)
    pair = get_pair("demo")
    target, loaded = build_target_engine(paths.model_dir(pair.target.name), dtype=dtype)
    draft, _ = build_draft_engine(paths.model_dir(pair.draft.name), dtype=dtype)
    shapes = {"beam cut": SpecShape.tree(len(SPECINFER_EXPANSION), max(SPECINFER_EXPANSION)),
              "expanded": SpecShape.expanded(SPECINFER_EXPANSION)}  # fmt: skip
    new, stats, sids = {}, {name: {"nodes": [], "accepted": []} for name in shapes}, []
    for i, text in enumerate((PROMPTS * 4)[:batch]):
        ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        sid = f"p{i}"
        sids.append(sid)
        first = target.prefill([PrefillItem(sid, ids)])[0]
        draft.prefill([PrefillItem(sid, ids)])
        new[sid] = [first.first_token]
    for _ in range(steps):
        beams = draft.speculate([shapes["beam cut"].spec_item(s, new[s]) for s in sids])
        cuts = [subtree(t, select_expansion(t, SPECINFER_EXPANSION)) for t in beams]
        trees = draft.speculate([shapes["expanded"].spec_item(s, []) for s in sids])  # the same context
        res = target.verify([VerifyItem(s, t) for s, t in zip(sids, trees)])
        for s, cut, t, r in zip(sids, cuts, trees, res):
            path = r.tokens[:-1]  # the accepted draft tokens; the last one is the bonus
            stats["expanded"]["nodes"].append(len(t))
            stats["expanded"]["accepted"].append(len(path))
            stats["beam cut"]["nodes"].append(len(cut))
            stats["beam cut"]["accepted"].append(matched(cut, path))
            new[s] = r.tokens
    rows = {name: {"nodes_mean": round(statistics.mean(v["nodes"]), 2),
                   "full_trees": round(sum(n == 20 for n in v["nodes"]) / len(v["nodes"]), 3),
                   "accepted_mean": round(statistics.mean(v["accepted"]), 3)} for name, v in stats.items()}  # fmt: skip
    results = {"name": OUT.name, "command": "python -m bench.diagnostics.specinfer_tree " + " ".join(sys.argv[1:]),
               "machine": machine(threads), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
               "duration_s": round(time.time() - started, 1), "batch": batch, "steps": steps, "dtype": dtype,
               "trees": rows}  # fmt: skip
    lines = [f"{name}: {r['nodes_mean']} nodes per tree ({r['full_trees']:.0%} with all 20), "
             f"{r['accepted_mean']} draft tokens accepted per step" for name, r in rows.items()]  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1))
    readme = [
        f"# {OUT.name}", "", f"Command: `{results['command']}`  ",
        f"Machine: {results['machine'].get('cpu_model')}, {threads} threads, {dtype}; {results['date']}", "",
        f"SpecInfer's tree <1,1,3,1,1,1,1,1> on the demo pair (SmolLM2-135M, its distilled draft), greedy, {batch} chat prompts x "
        f"{steps} steps per variant (bench/diagnostics/specinfer_tree.py):", "",
        *[f"- {line}" for line in lines], "",
    ]  # fmt: skip
    (OUT / "README.md").write_text("\n".join(readme))
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
