"""Drafting cost of the feature draft (EAGLE-3 head) per speculate call, its logits over the head's draft
vocabulary (now) against scattered into the whole vocabulary with -inf (before 2026-11-28), in process
(`python -m bench.diagnostics.draft_trees`)::

    tree 6x4: compact 28.2 ms, scattered 49.0 ms (-42 %); tree 3x2: 15.9 / 20.7 ms (-23 %); chain 3: -2 %

Both drafts follow the same target on the same prompts (a batch of ``batch``), each step every shape is
drafted by both, alternating which goes first; the target verifies what the compact one drafted (the two
draft the same trees: tests/shared/engine/test_eagle_draft.py). Medians over ``steps`` steps.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch
import typer

from bench.diagnostics.exit_signal import PROMPTS
from bench.run_info import machine
from shared.engine.factory import build_feature_draft_engine, build_target_engine
from shared.engine.types import PrefillItem, SpecItem, VerifyItem
from shared.models.paths import Paths
from shared.models.registry import get_pair

SHAPES = {"chain 3": {"chain_len": 3}, "tree 3x2": {"tree_depth": 3, "tree_width": 2},
          "tree 6x4": {"tree_depth": 6, "tree_width": 4}}  # fmt: skip


def scatter_to_full_vocabulary(draft) -> None:
    """Make ``draft`` return its logits as before: every vocabulary column, -inf outside the draft vocabulary."""
    runner = draft.runner
    ids = runner.logit_ids

    def scattered(works, hidden, rows):
        logits = runner.lm_head(runner.head.norm(hidden[rows])).float()  # [N, draft_vocab]
        full = logits.new_full((logits.shape[0], runner.vocab_size), float("-inf"))  # [N, vocab]
        full[:, ids.to(full.device)] = logits
        return full

    runner._logits = scattered
    runner.logit_ids = None


def main(
    batch: int = typer.Option(4, help="Sequences drafted per call."),
    steps: int = typer.Option(6, help="Measured steps (after 2 warm-up steps)."),
    dtype: str = typer.Option("bfloat16", help="Weights of both models."),
    threads: int = typer.Option(2, help="torch threads."),
    home: str = typer.Option(None, help="Tandem home (default ~/.cache/tandem)."),
) -> None:
    torch.set_num_threads(threads)
    started = time.time()
    paths = Paths.resolve(home)
    pair = get_pair("eagle")
    target_dir, head_dir = paths.model_dir(pair.target.name), paths.model_dir(pair.draft.name)
    target, loaded = build_target_engine(target_dir, dtype=dtype)
    drafts = {v: build_feature_draft_engine(head_dir, target_dir=target_dir, dtype=dtype) for v in ("compact", "scattered")}
    scatter_to_full_vocabulary(drafts["scattered"])
    spec = drafts["compact"].spec
    sids, new, feats = [], {}, {}
    for i, text in enumerate((PROMPTS * 2)[:batch]):
        ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        sid = f"p{i}"
        sids.append(sid)
        first = target.prefill([PrefillItem(sid, ids)], spec)[0]
        for d in drafts.values():
            d.prefill([PrefillItem(sid, ids, features=first.features)])
        new[sid], feats[sid] = [first.first_token], None
    times = {(s, v): [] for s in SHAPES for v in drafts}
    for step in range(steps + 2):
        for name, shape in SHAPES.items():
            order = list(drafts) if step % 2 == 0 else list(drafts)[::-1]
            trees = {}
            for v in order:
                t0 = time.perf_counter()
                trees[v] = drafts[v].speculate([SpecItem(s, new_tokens=new[s], features=feats[s], **shape) for s in sids])
                if step >= 2:
                    times[(name, v)].append(time.perf_counter() - t0)
            res = target.verify([VerifyItem(s, t) for s, t in zip(sids, trees["compact"])], spec)
            for s, r in zip(sids, res):
                new[s], feats[s] = r.tokens, r.features
    rows = [{"shape": name, **{v: round(statistics.median(times[(name, v)]) * 1e3, 2) for v in drafts}} for name in SHAPES]
    for r in rows:
        r["change"] = round(r["compact"] / r["scattered"] - 1, 3)
    results = {"name": "draft-trees", "command": "python -m bench.diagnostics.draft_trees " + " ".join(sys.argv[1:]),
               "machine": machine(threads), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
               "duration_s": round(time.time() - started, 1), "batch": batch, "steps": steps, "dtype": dtype,
               "draft_ms": rows}  # fmt: skip
    lines = [f"{r['shape']}: compact {r['compact']} ms, scattered {r['scattered']} ms ({r['change']:+.0%})" for r in rows]
    out = Path("bench/results/draft-trees")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    readme = [
        "# draft-trees", "", f"Command: `{results['command']}`  ",
        f"Machine: {results['machine'].get('cpu_model')}, {threads} threads, {dtype}; {results['date']}", "",
        f"Feature draft (EAGLE-3 head, 8,192-token draft vocabulary of 49,152) drafting for {batch} sequences, "
        f"medians of {steps} speculate calls per shape and variant (bench/diagnostics/draft_trees.py):", "",
        *[f"- {line}" for line in lines], "",
    ]  # fmt: skip
    (out / "README.md").write_text("\n".join(readme))
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
