"""Verify cost of a token tree against a chain of as many nodes, batch 1, in process
(`python -m bench.diagnostics.tree_verify`), with the row-exact attention gathering each tree row's positions
afresh (``gathered_rows``, as before 2026-11-28) and as it is now (ancestors moved in behind the
prefix, shared/engine/attention/row_exact.py), the four cases alternating step by step (medians)::

    ctx 1024 nodes 15: chain gathered 130.2 ms, chain now 126.4 ms, tree gathered 210.1 ms, tree now 142.5 ms; ...

SmolLM2-135M (the demo target) in bfloat16 on CPU, where 16-bit verifies of up to 16 rows take the
row-exact path. The tree: three branches from the root, node i's parent is i - 3.
"""

from __future__ import annotations

import statistics
import time

import torch
import typer

from shared.engine.attention import sdpa
from shared.engine.attention.row_exact import attend_rows
from shared.engine.config import EngineConfig
from shared.engine.loading import load_causal_lm
from shared.engine.runner import ModelRunner
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem
from shared.models import smollm2
from shared.models.paths import Paths


def gathered_rows(query, keys, values, row_slots, scaling):
    """attend_rows before 2026-11-28: a tree row's n positions gathered into a fresh tensor, per row and layer."""
    _, heads, rows, dim = query.shape
    kv = keys.shape[1]
    kf, vf = keys.float(), values.float()
    kt_all, vt_all = kf.permute(1, 2, 0), vf.transpose(0, 1)
    q = query[0].float().view(kv, heads // kv, rows, dim).permute(2, 0, 1, 3).contiguous()
    out = torch.empty(rows, kv, heads // kv, dim)
    ignored = q.new_zeros(())
    for t, seen in enumerate(row_slots):
        if isinstance(seen, int):
            kt, vt = kt_all[:, :, :seen], vt_all[:, :seen]
        else:
            idx = torch.cat([torch.arange(seen[0]), seen[1]]) if isinstance(seen, tuple) else seen
            kt, vt = kf.index_select(0, idx).permute(1, 2, 0), vf.index_select(0, idx).transpose(0, 1)
        scores = torch.baddbmm(ignored, q[t], kt, beta=0.0, alpha=scaling)
        torch.matmul(torch.softmax(scores, dim=-1), vt, out=out[t])
    return out.view(rows, heads, dim).to(query.dtype)[None]


def shapes(nodes: int) -> dict[str, TokenTree]:
    return {"chain": TokenTree([7] * nodes, list(range(-1, nodes - 1))),
            "tree": TokenTree([7] * nodes, [-1 if i < 3 else i - 3 for i in range(nodes)])}  # fmt: skip


def main(contexts: str = "256,1024", nodes: str = "4,15", repeats: int = 3, steps: int = 8, threads: int = 2) -> None:
    torch.set_num_threads(threads)
    model = load_causal_lm(smollm2.model_dir(Paths.resolve(None)), dtype="bfloat16", device="cpu")
    engine = TargetEngine(ModelRunner(model.model, EngineConfig(block_size=16, num_blocks=4096)))
    variants = {"gathered": gathered_rows, "now": attend_rows}
    for ctx in (int(c) for c in contexts.split(",")):
        for n in (int(x) for x in nodes.split(",")):
            cases = [(shape, name) for shape in ("chain", "tree") for name in variants]
            times: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
            for shape, name in cases:
                engine.prefill([PrefillItem(f"{shape}-{name}", [100 + i % 5000 for i in range(ctx)])])
            for step in range(1 + repeats * steps):  # the four cases alternate step by step, the order rotating
                for shape, name in cases[step % 4:] + cases[: step % 4]:
                    sdpa.attend_rows = variants[name]
                    t = time.perf_counter()
                    engine.verify([VerifyItem(f"{shape}-{name}", shapes(n)[shape])])  # rejects: the context grows by one
                    if step:  # the first step of each case warms its shape
                        times[(shape, name)].append(time.perf_counter() - t)
            sdpa.attend_rows = attend_rows
            engine.release([f"{shape}-{name}" for shape, name in cases])
            med = {c: statistics.median(v) * 1e3 for c, v in times.items()}
            print(f"ctx {ctx} nodes {n}: " + ", ".join(f"{s} {v} {m:.1f} ms" for (s, v), m in med.items())
                  + f"; tree/chain gathered {med[('tree', 'gathered')] / med[('chain', 'gathered')]:.2f}, "
                  f"now {med[('tree', 'now')] / med[('chain', 'now')]:.2f}", flush=True)


if __name__ == "__main__":
    typer.run(main)
