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


def fit_line(samples: Sequence[tuple[float, float]]) -> HostLine:
    """Least squares through (rows, seconds), clamped at >= 0; the median when every sample has the same rows."""
    if not samples:
        return HostLine()
    xs, ys = [float(x) for x, _ in samples], [max(0.0, float(y)) for _, y in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return HostLine(base_s=statistics.median(ys), samples=len(xs))
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
    base = max(0.0, my - slope * mx)
    return HostLine(base_s=base, per_seq_s=slope, samples=len(xs))


class HostTimes(BaseModel):
    """The three lines; JSON beside the fidelity results (host-times.json)."""

    target: HostLine = Field(default_factory=HostLine)
    draft: HostLine = Field(default_factory=HostLine)
    scheduler: HostLine = Field(default_factory=HostLine)


@dataclass
class HostSamples:
    target: list[tuple[int, float]] = field(default_factory=list)
    draft: list[tuple[int, float]] = field(default_factory=list)
    scheduler: list[tuple[int, float]] = field(default_factory=list)

    def fit(self) -> HostTimes:
        return HostTimes(target=fit_line(self.target), draft=fit_line(self.draft), scheduler=fit_line(self.scheduler))


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
            if out.cost is not None:
                samples.target.append((out.cost.num_seqs, wall - out.cost.duration_s))
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
            return out

        async def speculate(self, items):
            return await self._timed(self.engine.speculate, items)

    return TimedTarget(target_engine), TimedDraft(draft_engine)


@dataclass(frozen=True)
class HostCosts:
    """``inner``'s step costs plus host time: ``line.base_s`` per call, ``line.per_seq_s`` per sequence of a forward."""

    inner: StepCosts
    line: HostLine

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def call_s(self) -> float:
        return self.inner.call_s + self.line.base_s

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        return self.inner.forward_s(num_seqs, num_batched, num_context, verify) + self.line.per_seq_s * num_seqs


def with_host(costs: StepCosts, *lines: HostLine) -> StepCosts:
    """``costs`` paying the sum of ``lines`` (e.g. the target's engine host time and the scheduler's step time)."""
    line = HostLine(base_s=sum(x.base_s for x in lines), per_seq_s=sum(x.per_seq_s for x in lines),
                    samples=sum(x.samples for x in lines))  # fmt: skip
    return HostCosts(costs, line) if line.base_s or line.per_seq_s else costs
