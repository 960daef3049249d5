"""Step costs measured on a grid and interpolated: what the simulator charges when it can measure the model.

`tandem profile`'s cost model (SmartSpec eq. 4, one slope per batched token) is what the
policies plan with; it is a line through a curve that is not one on a CPU. A verify of a
3-token chain on one sequence costs about a decode there (the forward is bound by loading
the weights until a few rows), while 8 sequences of one token each cost 1.6x a decode
(per-sequence rows, attention calls and logits). So the simulator measures the forward it
will charge on a grid and interpolates::

    decode / verify   S in GRID_SEQS sequences x d in GRID_DEPTHS tokens each (root + d - 1 drafted),
                      at context SHORT_CONTEXT per sequence: the median of REPEATS forwards
    context           alpha, seconds per cached token: the same S x d at LONG_CONTEXT vs SHORT_CONTEXT
    prefill           one sequence of P in PREFILL_TOKENS prompt tokens (nothing cached)

    T(S, N, C) = bilinear(S, d = N / S) + alpha * (C - S * SHORT_CONTEXT)     (d <= max depth)
    T(S, N, C) = prefill(N)                                                 (d beyond: a prefill)

linear in S and d between grid points, extrapolated with the last segment's slope beyond
them. ``measure_grid`` runs on a ModelRunner (torch; the edge); the rest is pure.
"""

from __future__ import annotations

import statistics
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

GRID_SEQS = (1, 2, 4, 8, 16)
GRID_DEPTHS = (1, 2, 3, 4, 6, 8)
PREFILL_TOKENS = (16, 64, 128, 256, 512)
SHORT_CONTEXT = 64
LONG_CONTEXT = 512
REPEATS = 3


class GridProfile(BaseModel):
    """A grid of measured forwards (seconds); JSON beside the fidelity results."""

    model: str
    hardware: str = ""
    seqs: list[int]
    depths: list[int]
    seconds: list[list[float]] = Field(description="[seq index][depth index]: median forward at SHORT_CONTEXT.")
    alpha_s: float = Field(ge=0.0, description="Seconds per cached context token.")
    prefill_tokens: list[int]
    prefill_seconds: list[float]
    short_context: int = SHORT_CONTEXT
    created_at: str = Field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1) + "\n")
        return path


def pooled(a: GridProfile, b: GridProfile) -> GridProfile:
    """Two measurements of the same grid (before and after a run) averaged cell by cell."""
    mean = lambda x, y: (x + y) / 2  # noqa: E731
    return a.model_copy(update={
        "seconds": [[mean(x, y) for x, y in zip(ra, rb)] for ra, rb in zip(a.seconds, b.seconds)],
        "alpha_s": mean(a.alpha_s, b.alpha_s),
        "prefill_seconds": [mean(x, y) for x, y in zip(a.prefill_seconds, b.prefill_seconds)],
    })  # fmt: skip


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear through (xs, ys), extended with the first / last segment's slope."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[i], xs[i + 1], ys[i], ys[i + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class GridCosts:
    """StepCosts (step_costs.py) from a GridProfile."""

    name: str
    grid: GridProfile
    call_s: float = 0.0

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        g = self.grid
        seqs = max(num_seqs, 1)
        depth = num_batched / seqs
        if depth > g.depths[-1]:  # prompt tokens, not a chain: a prefill of num_batched tokens
            return max(_interp(g.prefill_tokens, g.prefill_seconds, num_batched), 1e-6)
        per_seq = [_interp(g.depths, row, max(depth, 1.0)) for row in g.seconds]
        t = _interp(g.seqs, per_seq, seqs) + g.alpha_s * (num_context - seqs * g.short_context)
        return max(t, 1e-6)


def grid_costs(grid: GridProfile, call_s: float = 0.0) -> GridCosts:
    """GridCosts, after checking the grid is one (ValueError naming what is wrong)."""
    if len(grid.seconds) != len(grid.seqs) or any(len(r) != len(grid.depths) for r in grid.seconds):
        raise ValueError(f"grid profile {grid.model}: seconds is not {len(grid.seqs)} x {len(grid.depths)}")
    if sorted(set(grid.seqs)) != grid.seqs or sorted(set(grid.depths)) != grid.depths:
        raise ValueError(f"grid profile {grid.model}: seqs and depths must be strictly increasing")
    if len(grid.prefill_tokens) != len(grid.prefill_seconds) or not grid.prefill_tokens:
        raise ValueError(f"grid profile {grid.model}: prefill_tokens and prefill_seconds differ in length")
    if any(t <= 0 for row in grid.seconds for t in row) or any(t <= 0 for t in grid.prefill_seconds):
        raise ValueError(f"grid profile {grid.model}: every measured forward must take > 0 s")
    return GridCosts(grid.model, grid, call_s)


def measure_grid(runner, model: str, seqs: Sequence[int] = GRID_SEQS, depths: Sequence[int] = GRID_DEPTHS,
                 prefill_tokens: Sequence[int] = PREFILL_TOKENS, repeats: int = REPEATS) -> GridProfile:  # fmt: skip
    """Measure the grid on a ModelRunner (its KV pool must hold max(seqs) x SHORT_CONTEXT + 4 x LONG_CONTEXT tokens)."""
    import os

    from shared.profiling.measure import Work, _verify_forward, hardware_name

    vocab = runner.vocab_size
    ids = [f"grid-{os.getpid()}-{i}" for i in range(max(seqs))]
    held = [runner.add(sid, [(11 + 7 * i + j) % vocab for j in range(SHORT_CONTEXT)]) for i, sid in enumerate(ids)]
    try:
        runner.forward([Work(s) for s in held])
        _verify_forward(runner, held, len(held))  # warm-up

        def cell(s: int, d: int) -> float:
            return statistics.median(_verify_forward(runner, held[:s], s * d).duration_s for _ in range(repeats))

        seconds = [[cell(s, d) for d in depths] for s in seqs]
        probe = [(s, d) for s in seqs if s <= 4 for d in (1, depths[-1])]
        short = [cell(s, d) for s, d in probe]
        grow = LONG_CONTEXT - SHORT_CONTEXT
        for i, seq in enumerate(held[: max(s for s, _ in probe)]):
            runner.commit(seq, [(13 + 5 * i + j) % vocab for j in range(grow)])
        runner.forward([Work(s) for s in held[: max(s for s, _ in probe)]])
        long = [cell(s, d) for s, d in probe]
        alpha = max(0.0, statistics.median((b - a) / (s * grow) for (s, _), a, b in zip(probe, short, long)))
    finally:
        for sid in ids:
            runner.release(sid)

    prefill = []
    for n in prefill_tokens:
        times = []
        for r in range(repeats):
            sid = f"grid-prefill-{os.getpid()}-{n}-{r}"
            seq = runner.add(sid, [(17 + 3 * r + j) % vocab for j in range(n)])
            try:
                times.append(runner.forward([Work(seq)]).cost.duration_s)
            finally:
                runner.release(sid)
        prefill.append(statistics.median(times))
    return GridProfile(model=model, hardware=hardware_name(runner.device), seqs=list(seqs), depths=list(depths),
                       seconds=seconds, alpha_s=alpha, prefill_tokens=list(prefill_tokens), prefill_seconds=prefill)  # fmt: skip
