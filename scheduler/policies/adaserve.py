"""SLO-customized token trees under a verify budget (AdaServe §3-5, Algorithm 2), and the tree baselines.

One iteration of every policy here, for a batch of n requests and budget B::

    decide     speculation phase: one beam-search candidate tree per request,
               d = max(1, min(D_max, ceil(B / n)))      (eq. 8)
               w = max(1, min(W_max, floor(B / n)))     (eq. 9)
    select     prune the candidates to at most B verify tokens (roots included):
               AdaServe       SLO-customized, then throughput-optimized selection (Algorithm 2)
               GlobalGreedy   throughput-optimized selection only (§6.3)
               EqualGreedy    floor(B / n) per request, greedy within each tree (§6.3)
    observe    learn t_spec, the iteration latency, from the step reports

SpecInferTree is the fixed-shape baseline (§6.1): a <1,1,3,1,1,1,1,1> tree per
request, whatever the load; it ignores B.

A(r) (§3) is what request r must emit this iteration to stay on its SLO. With
TPOT = (t_last - t_first) / (n - 1), after this iteration

    (l + t_spec) / (o + acc) <= t_TPOT   <=>   acc >= (l + t_spec) / t_TPOT - o = A(r)    (eq. 2)

where l = now - t_first, o = tokens emitted after the first, and acc counts
what the verify step emits (accepted nodes + the bonus token). Requests
without a TPOT SLO are best effort: A = 0, so they only get
throughput-optimized nodes.

Pure: plain data in, shapes and trees out; no I/O, no clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field

from scheduler.policies.selection import (
    TreeSelector,
    select_equal_greedy,
    select_expansion,
    select_global_greedy,
    select_slo_customized,
    subtree,
)
from scheduler.policies.speculation import SpecContext, SpecShape, SpeculationPolicy
from scheduler.report import StepReport
from scheduler.request import Request, SpecMode
from shared.engine.types import TokenTree

SPECINFER_EXPANSION = (1, 1, 3, 1, 1, 1, 1, 1)  # SpecInfer's default tree (AdaServe §6.1)


class TreePolicyConfig(BaseModel):
    """Knobs of the budgeted tree policies; every field has a default."""

    token_budget: int = Field(
        32,
        ge=1,
        description="B, verify tokens per forward (roots included), used when the scheduler has no profiled "
        "budget (SpecContext.token_budget).",
    )
    max_depth: int = Field(6, ge=1, le=16, description="D_max of eq. 8: deepest candidate tree.")
    max_width: int = Field(4, ge=1, le=16, description="W_max of eq. 9: widest beam.")
    n_max: int = Field(
        8, ge=0, description="Most nodes one request may take in the SLO-customized selection (Algorithm 2)."
    )
    iteration_ema: float = Field(
        0.3, gt=0.0, le=1.0, description="Weight of the newest iteration in the t_spec moving average."
    )
    initial_iteration_s: float = Field(0.0, ge=0.0, description="t_spec before the first iteration is observed.")


def speculation_shape(num_requests: int, budget: int, max_depth: int, max_width: int) -> SpecShape:
    """Candidate tree for each of ``num_requests`` requests sharing ``budget`` verify tokens (eq. 8-9)."""
    if num_requests <= 0:
        return SpecShape.none()
    d = max(1, min(max_depth, math.ceil(budget / num_requests)))  # eq. 8
    w = max(1, min(max_width, budget // num_requests))  # eq. 9
    return SpecShape.tree(d, w)


def required_tokens(req: Request, now: float, t_spec: float) -> float:
    """A(r) = (l + t_spec) / t_TPOT - o: tokens ``req`` must emit this iteration for its TPOT SLO (§3).

    0 for best-effort requests (no TPOT SLO) and before the first token (TPOT starts there).
    """
    if req.slo.tpot_ms is None or req.first_token_time is None:
        return 0.0
    latency = now - req.first_token_time  # l: since the first token
    decoded = req.num_generated - 1  # o: tokens after the first
    return (latency + t_spec) / (req.slo.tpot_ms / 1e3) - decoded


class _BudgetedTrees(SpeculationPolicy):
    """Eq. 8-9 candidate trees for every AUTO request; subclasses choose how the budget is spent.

    Requests whose shape the scheduler fixed (mode FIXED chains) keep their
    whole tree and are charged to the budget first; nothing else is pruned
    away from them.
    """

    def __init__(self, config: TreePolicyConfig | None = None) -> None:
        self.config = config or TreePolicyConfig()
        self.t_spec = self.config.initial_iteration_s  # EMA of observed iteration latency

    def budget(self, ctx: SpecContext) -> int:
        return ctx.token_budget if ctx.token_budget else self.config.token_budget

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        budget = self.budget(ctx)
        if budget <= len(batch):  # the roots alone spend B: no node could be selected
            return [SpecShape.none()] * len(batch)
        shape = speculation_shape(len(batch), budget, self.config.max_depth, self.config.max_width)
        return [shape] * len(batch)

    def tree_selector(self) -> TreeSelector:
        return self

    def observe(self, report: StepReport) -> None:
        if report.batch_size == 0:
            return
        a = self.config.iteration_ema
        t = report.times.total
        self.t_spec = t if self.t_spec == 0.0 else a * t + (1 - a) * self.t_spec

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        auto = [i for i, r in enumerate(batch) if r.speculation.mode is SpecMode.AUTO]
        fixed_nodes = sum(len(trees[i]) for i, r in enumerate(batch) if r.speculation.mode is not SpecMode.AUTO)
        # the fixed requests' roots and nodes come off the budget first
        budget = self.budget(ctx) - (len(batch) - len(auto)) - fixed_nodes
        keep = self.choose([batch[i] for i in auto], [trees[i] for i in auto], budget, ctx)
        out = list(trees)
        for i, nodes in zip(auto, keep):
            out[i] = subtree(trees[i], nodes)
        return out

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext
    ) -> list[list[int]]:
        """Node indices to keep per tree, spending at most ``budget`` verify tokens (roots included)."""
        raise NotImplementedError


class AdaServe(_BudgetedTrees):
    """SLO-customized speculative decoding (AdaServe Algorithm 2)."""

    name = "adaserve"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext
    ) -> list[list[int]]:
        required = [required_tokens(r, ctx.now, self.t_spec) for r in batch]
        return select_slo_customized(trees, required, budget, self.config.n_max)


class GlobalGreedy(_BudgetedTrees):
    """AdaServe without the SLO-customized step: the globally most probable nodes (§6.3)."""

    name = "global_greedy"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext
    ) -> list[list[int]]:
        return select_global_greedy(trees, budget)


class EqualGreedy(_BudgetedTrees):
    """An equal share of the budget per request, greedy within each tree (§6.3; budget-aware Eagle-2)."""

    name = "equal_greedy"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext
    ) -> list[list[int]]:
        return select_equal_greedy(trees, budget)


class SpecInferTree(SpeculationPolicy):
    """A fixed tree per request (SpecInfer's expansion <1,1,3,1,1,1,1,1>), blind to load and SLOs.

    The draft is asked for a beam of depth len(expansion) and width
    max(expansion); the expansion is then cut out of it (``select_expansion``),
    so a branch the beam did not keep is missing rather than drafted anew.
    """

    name = "specinfer"

    def __init__(self, expansion: Sequence[int] = SPECINFER_EXPANSION) -> None:
        if not expansion or min(expansion) < 1:
            raise ValueError(f"an expansion needs at least one layer and >= 1 child per node, got {expansion}")
        self.expansion = tuple(expansion)
        self.shape = SpecShape.tree(len(self.expansion), max(self.expansion))

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        return [self.shape] * len(batch)

    def tree_selector(self) -> TreeSelector:
        return self

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        return [
            subtree(tree, select_expansion(tree, self.expansion)) if r.speculation.mode is SpecMode.AUTO else tree
            for r, tree in zip(batch, trees)
        ]
