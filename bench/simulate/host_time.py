"""Host time the forward grids do not see: measured on the real run, charged by the simulator.

The grids (grid_costs.py) time the model's forward alone. A real step costs more, and the more so the
more sequences it serves:

    engine host   a worker call's wall time minus its forwards: tree building, acceptance and sampling,
                  KV bookkeeping, the hand-off to the engine's thread. Per target / draft call, from the
                  engines' own ForwardCost of the call (TimedTarget / TimedDraft wrap the local workers).
    scheduler     the loop's own time per step: select + commit + overhead of the StepReport (planning,
                  the policies, admission, stop checks). On the simulator's virtual clock the same code
                  takes no time at all (HostTimeRecorder, an iteration observer).

Each is fitted as a line in the rows a call or step serves, t = base_s + per_seq_s * rows (least squares,
both clamped at >= 0), where rows = sequences per forward summed over the call's forwards (a draft chain of
k on S sequences: about k * S) or, for the scheduler, the sequences verified in the step. ``HostCosts``
wraps a StepCosts so the simulated workers pay it: base_s per call, per_seq_s per sequence of every forward;
the scheduler's line is charged with the target's calls (one verify per step).

A third term is inside the forward itself. The grid times each forward alone, on sequences of one
context length in fresh KV blocks; in the serving loop the same forward shares the process with the
event loop's thread (the GIL, the caches) and serves sequences of mixed lengths in scattered blocks.
Measured call by call in one diagnostic run here (the demo pair, an open loop at 2x capacity), a real decode or
verify forward cost the grid's charge plus about 0.8 ms per sequence on the target and 0.25 ms on the
draft (5-15 % at 4-7 sequences), none of it visible at one sequence. ``fit_forward_excess`` fits that
excess per sequence over the real run's decode and verify forwards (prefills excluded: their excess is
the draft's overlapping prefill, which the shared processor models, shared_processor.py).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from bench.simulate.step_costs import StepCosts
from scheduler.report import StepReport
from scheduler.workers import NullObserver


class HostLine(BaseModel):
    """t = base_s + per_seq_s * rows, fitted on ``samples`` (rows, seconds) pairs."""

    base_s: float = Field(0.0, ge=0.0)
    per_seq_s: float = Field(0.0, ge=0.0)
    samples: int = 0

    def __call__(self, rows: float) -> float:
        return self.base_s + self.per_seq_s * rows


def fit_forward_excess(forwards: Sequence[tuple[int, int, int, float]], costs: StepCosts, max_depth: int = 8) -> HostLine:
    """Real forward time over ``costs``' charge, per sequence: (S, N, C, seconds) of decode / verify forwards.

    A line in S; where its intercept comes out negative, the line through the origin instead (the excess
    grows with the sequences served; at S = 1 the grid is the measurement). Prefills (N / S > max_depth) skipped.
    """
    rows = [(s, t - costs.forward_s(s, n, c, n > s)) for s, n, c, t in forwards if s and n <= max_depth * s]
    if not rows:
        return HostLine()
    line = fit_line(rows, clamp_samples=False)
    if line.base_s > 0 or line.per_seq_s == 0:
        return line
    sxx = sum(x * x for x, _ in rows)
    return HostLine(per_seq_s=max(0.0, sum(x * y for x, y in rows) / sxx), samples=len(rows))


def fit_line(samples: Sequence[tuple[float, float]], clamp_samples: bool = True) -> HostLine:
    """Least squares through (rows, seconds), clamped at >= 0; the median when every sample has the same rows."""
    if not samples:
        return HostLine()
    xs = [float(x) for x, _ in samples]
    ys = [max(0.0, float(y)) if clamp_samples else float(y) for _, y in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return HostLine(base_s=max(0.0, statistics.median(ys)), samples=len(xs))
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
    base = max(0.0, my - slope * mx)
    return HostLine(base_s=base, per_seq_s=slope, samples=len(xs))


class HostTimes(BaseModel):
    """The lines; JSON beside the fidelity results (host-times.json)."""

    target: HostLine = Field(default_factory=HostLine)
    draft: HostLine = Field(default_factory=HostLine)
    scheduler: HostLine = Field(default_factory=HostLine)
    target_forward: HostLine = Field(default_factory=HostLine, description="Forward time in the loop over the grid's.")
    draft_forward: HostLine = Field(default_factory=HostLine)


@dataclass
class HostSamples:
    target: list[tuple[int, float]] = field(default_factory=list)
    draft: list[tuple[int, float]] = field(default_factory=list)
    scheduler: list[tuple[int, float]] = field(default_factory=list)
    target_forwards: list[tuple[int, int, int, float]] = field(default_factory=list)  # (S, N, C, seconds)
    draft_forwards: list[tuple[int, int, int, float]] = field(default_factory=list)

    def fit(self, target_costs: StepCosts | None = None, draft_costs: StepCosts | None = None) -> HostTimes:
        """The host lines; with the grids' costs also each forward's excess over its grid charge."""
        out = HostTimes(target=fit_line(self.target), draft=fit_line(self.draft), scheduler=fit_line(self.scheduler))
        if target_costs is not None:
            out.target_forward = fit_forward_excess(self.target_forwards, target_costs)
        if draft_costs is not None:
            out.draft_forward = fit_forward_excess(self.draft_forwards, draft_costs)
        return out


class HostTimeRecorder(NullObserver):
    """The scheduler's own time per step (select + commit + overhead) against the sequences it verified."""

    def __init__(self, samples: HostSamples) -> None:
        self.samples = samples

    def on_step(self, report: StepReport) -> None:
        if report.batch_size:
            t = report.times
            self.samples.scheduler.append((report.batch_size, t.select + t.commit + t.overhead))


def timed_workers(target_engine, draft_engine, samples: HostSamples):
    """Local workers (the services' engines without gRPC) that record each call's wall time minus its forwards."""
    from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker

    class TimedTarget(LocalTargetWorker):
        async def _step(self, prefills, verifies):
            t = time.perf_counter()
            out = await asyncio.to_thread(self.engine.step, prefills, verifies, self.feature_spec)
            wall = time.perf_counter() - t
            if (c := out.cost) is not None:
                samples.target.append((c.num_seqs, wall - c.duration_s))
                samples.target_forwards.append((c.num_seqs, c.num_batched_tokens, c.num_context_tokens, c.duration_s))
            return out

        async def prefill(self, items):
            return (await self._step(items, [])).prefills

        async def verify(self, items):
            return (await self._step([], items)).verifies

    class TimedDraft(LocalDraftWorker):
        async def _timed(self, fn, items):
            t = time.perf_counter()
            out = await asyncio.to_thread(fn, items)
            wall = time.perf_counter() - t
            costs = list(getattr(self.engine, "costs", []) or [])
            if costs:
                samples.draft.append((sum(c.num_seqs for c in costs), wall - sum(c.duration_s for c in costs)))
                samples.draft_forwards += [(c.num_seqs, c.num_batched_tokens, c.num_context_tokens, c.duration_s) for c in costs]
            return out

        async def speculate(self, items):
            return await self._timed(self.engine.speculate, items)

    return TimedTarget(target_engine), TimedDraft(draft_engine)


@dataclass(frozen=True)
class HostCosts:
    """``inner``'s step costs plus host time: ``line.base_s`` per call, ``line.per_seq_s`` per sequence of a forward,
    and ``forward`` (the forward's own excess over ``inner``) on every forward."""

    inner: StepCosts
    line: HostLine
    forward: HostLine = field(default_factory=HostLine)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def call_s(self) -> float:
        return self.inner.call_s + self.line.base_s

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        inner = self.inner.forward_s(num_seqs, num_batched, num_context, verify)
        return inner + self.line.per_seq_s * num_seqs + self.forward(num_seqs)


def with_host(costs: StepCosts, *lines: HostLine, forward: HostLine | None = None) -> StepCosts:
    """``costs`` paying the sum of ``lines`` (e.g. the target's engine host time and the scheduler's step time)
    per call, and ``forward`` (fit_forward_excess) on every forward."""
    line = HostLine(base_s=sum(x.base_s for x in lines), per_seq_s=sum(x.per_seq_s for x in lines),
                    samples=sum(x.samples for x in lines))  # fmt: skip
    forward = forward or HostLine()
    if line.base_s or line.per_seq_s or forward.base_s or forward.per_seq_s:
        return HostCosts(costs, line, forward)
    return costs
