"""Row-exact attention against its first formula, interleaved (`python -m bench.diagnostics.attention_rows`).

    rows=3 old 98.7 us new 86.9 us per layer      medians over interleaved repeats, N = 200 positions, bf16
    python -m bench.diagnostics.attention_rows --shape tree --positions 1024 --rows 4,16
                                                  tree rows (3 branches from the root): old = a gather per row

``reference_rows`` is attend_rows as first written (matmul, then the scaling, softmax, matmul, a copy
per row); tests/shared/engine/test_matmul_attention.py checks the two agree bit for bit, this times them.
"""

from __future__ import annotations

import statistics
import time

import torch
import typer

from shared.engine.attention.row_exact import attend_rows


def reference_rows(query, keys, values, row_slots, scaling):
    """attend_rows as first written: matmul, then the scaling, softmax, matmul, a copy per row."""
    _, heads, rows, dim = query.shape
    kv = keys.shape[1]
    kf, vf = keys.float(), values.float()
    q = query[0].float().view(kv, heads // kv, rows, dim).permute(2, 0, 1, 3).contiguous()
    out = torch.empty(rows, kv, heads // kv, dim)
    for t, seen in enumerate(row_slots):
        kt, vt = (kf[:seen], vf[:seen]) if isinstance(seen, int) else (kf.index_select(0, seen), vf.index_select(0, seen))
        scores = torch.matmul(q[t], kt.permute(1, 2, 0)) * scaling
        out[t] = torch.matmul(torch.softmax(scores, dim=-1), vt.transpose(0, 1))
    return out.view(rows, heads, dim).to(query.dtype)[None]


def _median_us(fn, args, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter_ns()
        fn(*args)
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e3


def tree_rows(positions: int, n_rows: int) -> list[int | torch.Tensor]:
    """The root row (the context), then nodes 0 .. n_rows - 2 of a 3-branch tree (node i's parent is i - 3):
    each node row sees the context and its ancestors."""
    out: list[int | torch.Tensor] = [positions]
    for i in range(n_rows - 1):
        path = sorted(range(i, -1, -3))
        out.append(positions + 1 if path == [0] else torch.tensor([*range(positions), *(positions + j for j in path)]))
    return out


def main(positions: int = 200, repeats: int = 5, calls: int = 1500, rows: str = "1,3,5",
         shape: str = typer.Option("chain", help="chain (row t sees the first N + t + 1) or tree (tree_rows)")) -> None:
    """SmolLM2-135M's shapes (9 query heads, 3 KV heads of 64), bf16; old and new alternate within each repeat."""
    torch.manual_seed(0)
    results: dict[tuple[int, str], list[float]] = {}
    for _ in range(repeats):
        for n_rows in (int(r) for r in rows.split(",")):
            q = torch.randn(1, 9, n_rows, 64, dtype=torch.bfloat16)
            k, v = (torch.randn(positions + n_rows, 3, 64, dtype=torch.bfloat16) for _ in range(2))
            slots = tree_rows(positions, n_rows) if shape == "tree" else [positions + t + 1 for t in range(n_rows)]
            args = (q, k, v, slots, 0.125)
            for name, fn in (("old", reference_rows), ("new", attend_rows)):
                results.setdefault((n_rows, name), []).append(_median_us(fn, args, calls))
    for (n_rows, name), values in sorted(results.items()):
        print(f"rows={n_rows} {name}: {statistics.median(values):.1f} us per layer ({min(values):.1f}..{max(values):.1f})")


if __name__ == "__main__":
    typer.run(main)
