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

``marginal_cost`` (``adaserve:marginal``, ``global_greedy:marginal``): B is
where a GPU's verify stops being free; on a CPU a verify token costs ~1 ms
from the first one, so filling B verifies nodes worth less than they cost.
With the option the throughput-optimized step takes a node only while it
raises the step's expected tokens per second (selection.MarginalCost, priced
by the profiled cost model and the observed drafting time); the
SLO-customized step is unchanged.

SpecInferTree is the fixed-shape baseline (§6.1): a <1,1,3,1,1,1,1,1> tree per
request, whatever the load; it ignores B.

A(r) (§3) is what request r must emit this iteration to stay on its SLO. With
TPOT = (t_last - t_first) / (n - 1), after this iteration

    (l + t_spec) / (o + acc) <= t_TPOT   <=>   acc >= (l + t_spec) / t_TPOT - o = A(r)    (eq. 2)

where l = now - t_first, o = tokens emitted after the first, and acc counts
what the verify step emits (accepted nodes + the bonus token). Requests
without a TPOT SLO are best effort: A = 0, so they only get
throughput-optimized nodes.

``paced`` (``adaserve:paced``; eq. 5 with the step's time priced): A(r) uses t_spec, the iteration's
time, as if it did not depend on the tokens selected, which holds below B on a GPU. Where each verified
token adds c to the step (a CPU: the profile's gamma), every node taken raises every request's A by
c / t_TPOT, so filling the budget for throughput (the relaxed requests' nodes as much as anyone's) can
push the stringent requests that meet their SLO this step below it. With ``paced`` the
throughput-optimized step skips such a node (selection.SloPace), with
T(N) = t_spec - c * (nodes verified lately) + c * N.

``triage`` (``adaserve:triage``; not in the paper): Algorithm 2 serves the
largest A(r) first, and a request far behind its SLO has the largest A, so
under overload the requests that can no longer make their SLO take their
n_max nodes first, the ones that still could fall behind too, and tokens per
step drop with them (simulated 8B at 19.5 req/s: AdaServe 1.59 tokens/step,
moderate class 0.42, against GlobalGreedy's 2.04 and 1.00). With triage a
request is left out of the SLO-customized step (A = 0: throughput-optimized
nodes only) once even emitting a_max tokens every remaining step cannot bring
its TPOT under the SLO::

    (l + (R / a_max) * t_spec) / (o + R) > t_TPOT   <=>   l / t_TPOT - o > R * (1 - rho / a_max)

R: tokens it may still emit (max_new_tokens left), rho = t_spec / t_TPOT: what
one iteration must emit to keep pace, a_max = 1 + the sum of its candidate's
n_max largest f(v): what the SLO-customized step could give it in
expectation. The bound is optimistic (a_max every step, the full R to catch
up in), so a request is only dropped when it is lost in every case.

Pure: plain data in, shapes and trees out; no I/O, no clock of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, Field

from scheduler.policies.selection import (
    MarginalCost,
    SloPace,
    TreeSelector,
    node_depths,
    path_probs,
    select_equal_greedy,
    select_expansion,
    select_global_greedy,
    select_slo_customized,
    subtree,
    tree_depth,
    tree_width,
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
    paced: bool = Field(
        False,
        description="Price the step's time in A(r): the throughput-optimized selection skips a node that would "
        "push a request meeting its SLO this step below it (selection.SloPace; module docstring). Needs the "
        "profiled cost model. AdaServe only.",
    )
    triage: bool = Field(
        False,
        description="Leave requests that can no longer meet their TPOT SLO out of the SLO-customized selection "
        "(recoverable(); module docstring). AdaServe only.",
    )
    iteration_ema: float = Field(
        0.3, gt=0.0, le=1.0, description="Weight of the newest iteration in the t_spec moving average."
    )
    initial_iteration_s: float = Field(0.0, ge=0.0, description="t_spec before the first iteration is observed.")
    marginal_cost: bool = Field(
        False,
        description="Spend the budget only on nodes that raise the step's expected goodput (selection.MarginalCost), "
        "priced by the profiled cost model: for hardware whose verify time grows from the first token (a CPU). "
        "Off = the paper's rule, fill B. AdaServe and GlobalGreedy.",
    )
    price_depth: bool = Field(
        False,
        description="With marginal_cost: also price the drafting of each beam level (priced_depth()), so the next "
        "candidate is drafted only as deep as its levels pay for their drafting. AdaServe and GlobalGreedy.",
    )


def speculation_shape(num_requests: int, budget: int, max_depth: int, max_width: int) -> SpecShape:
    """Candidate tree for each of ``num_requests`` requests sharing ``budget`` verify tokens (eq. 8-9)."""
    if num_requests <= 0:
        return SpecShape.none()
    d = max(1, min(max_depth, math.ceil(budget / num_requests)))  # eq. 8
    w = max(1, min(max_width, budget // num_requests))  # eq. 9
    return SpecShape.tree(d, w)


def behind(req: Request, now: float) -> float | None:
    """l / t_TPOT - o: how many tokens ``req`` is behind its SLO's pace now (negative: ahead); None for
    best-effort requests (no TPOT SLO) and before the first token (TPOT starts there)."""
    if req.slo.tpot_ms is None or req.first_token_time is None:
        return None
    # l: since the first token; o: tokens after the first
    return (now - req.first_token_time) / (req.slo.tpot_ms / 1e3) - (req.num_generated - 1)


def required_tokens(req: Request, now: float, t_spec: float) -> float:
    """A(r) = (l + t_spec) / t_TPOT - o: tokens ``req`` must emit this iteration for its TPOT SLO (§3).

    0 for best-effort requests (no TPOT SLO) and before the first token (TPOT starts there).
    """
    deficit = behind(req, now)
    return 0.0 if deficit is None else deficit + t_spec / (req.slo.tpot_ms / 1e3)


def recoverable(req: Request, now: float, t_spec: float, a_max: float) -> bool:
    """Can ``req`` still end within its TPOT SLO if it emits ``a_max`` tokens every remaining iteration?

    l / t_TPOT - o <= R * (1 - rho / a_max), rho = t_spec / t_TPOT (module docstring, ``triage``). True for
    requests without a TPOT SLO or before their first token.
    """
    deficit = behind(req, now)
    if deficit is None:
        return True
    rho = t_spec / (req.slo.tpot_ms / 1e3)
    return deficit <= req.num_remaining * (1.0 - rho / max(a_max, 1e-9))


def best_emission(tree: TokenTree, n_max: int) -> float:
    """a_max: 1 (the bonus token) + the n_max largest f(v) of ``tree`` (a valid subtree: f(child) <= f(parent))."""
    return 1.0 + sum(sorted(path_probs(tree), reverse=True)[:n_max])


def priced_depth(trees: Sequence[TokenTree], cost: MarginalCost, level_s: float) -> int:
    """The deepest level k such that every level up to k paid for itself in this selection (``price_depth``).

    A level pays when its nodes raise the step's expected goodput, the marginal rule's test with the level's
    drafting added to its verify tokens (SmartSpec eq. 3 for a whole level)::

        mass_k * T > (level_s + c * nodes_k) * E

    mass_k: the summed f(v) of the kept nodes at depth k, nodes_k: how many; E: the step's expected tokens
    (a bonus token per request + every kept node's f); T: the step's time (drafting + the verify of
    everything kept); level_s: one beam level's drafting (the observed drafting over the depth drafted).
    0 when not even the first level paid.
    """
    mass: dict[int, float] = {}
    nodes: dict[int, int] = {}
    for tree in trees:
        for depth, f in zip(node_depths(tree), path_probs(tree)):
            mass[depth] = mass.get(depth, 0.0) + f
            nodes[depth] = nodes.get(depth, 0) + 1
    c = cost.per_token_s
    expected = len(trees) + sum(mass.values())
    step = cost.step_s + c * sum(nodes.values())
    deepest = 0
    for k in range(1, max(mass, default=0) + 1):
        if mass.get(k, 0.0) * step <= (level_s + c * nodes.get(k, 0)) * expected:
            break
        deepest = k
    return deepest


class _BudgetedTrees(SpeculationPolicy):
    """Eq. 8-9 candidate trees for every AUTO request; subclasses choose how the budget is spent.

    Requests whose shape the scheduler fixed (mode FIXED chains) keep their
    whole tree and are charged to the budget first; nothing else is pruned
    away from them.
    """

    def __init__(self, config: TreePolicyConfig | None = None) -> None:
        self.config = config or TreePolicyConfig()
        self.t_spec = self.config.initial_iteration_s  # EMA of observed iteration latency
        self.t_draft = 0.0  # EMA of the observed drafting time (sunk when the selection runs)
        self.used_depth: int | None = None  # marginal_cost: deepest node the last selection kept
        self.used_width = 0  # marginal_cost: most nodes the last selection kept in one layer of one tree
        self.nodes_verified = 0.0  # EMA of the drafted nodes a step verified (paced: t_spec's token-proportional part)
        self.fixed_nodes = 0  # this step's nodes of FIXED-mode requests (select() sets it before choose())

    def budget(self, ctx: SpecContext) -> int:
        return ctx.token_budget if ctx.token_budget else self.config.token_budget

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        budget = self.budget(ctx)
        if budget <= len(batch):  # the roots alone spend B: no node could be selected
            return [SpecShape.none()] * len(batch)
        shape = speculation_shape(len(batch), budget, self.config.max_depth, self.config.max_width)
        if self.config.marginal_cost and self.used_depth is not None and shape.speculates:
            # draft one layer deeper and one beam wider than the last selection used, not what it would
            # prune unverified (drafting is half the cost of a tree step on a CPU)
            shape = SpecShape.tree(min(shape.depth, self.used_depth + 1), min(shape.width, self.used_width + 1))
        return [shape] * len(batch)

    def tree_selector(self) -> TreeSelector:
        return self

    def observe(self, report: StepReport) -> None:
        if report.batch_size == 0:
            return
        a = self.config.iteration_ema
        t = report.times.total
        self.t_spec = t if self.t_spec == 0.0 else a * t + (1 - a) * self.t_spec
        if report.times.speculate > 0:
            d = report.times.speculate
            self.t_draft = d if self.t_draft == 0.0 else a * d + (1 - a) * self.t_draft

    def marginal_cost(self, batch: Sequence[Request], fixed_nodes: int, ctx: SpecContext) -> MarginalCost | None:
        """What a verify token costs against this step (None: the option is off or nothing is profiled)."""
        cm = ctx.cost_model
        if not self.config.marginal_cost or cm is None or cm.gamma_s <= 0:
            return None
        context = float(sum(r.num_tokens for r in batch))
        verify = cm.predict(context, len(batch) + fixed_nodes, verify=True)  # the roots and the fixed trees
        return MarginalCost(per_token_s=cm.gamma_s, step_s=self.t_draft + verify)

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        auto = [i for i, r in enumerate(batch) if r.speculation.mode is SpecMode.AUTO]
        fixed_nodes = sum(len(trees[i]) for i, r in enumerate(batch) if r.speculation.mode is not SpecMode.AUTO)
        # the fixed requests' roots and nodes come off the budget first
        budget = self.budget(ctx) - (len(batch) - len(auto)) - fixed_nodes
        cost = self.marginal_cost(batch, fixed_nodes, ctx)
        self.fixed_nodes = fixed_nodes  # paced: verified this step whatever the selection takes
        keep = self.choose([batch[i] for i in auto], [trees[i] for i in auto], budget, ctx, cost)
        out = list(trees)
        for i, nodes in zip(auto, keep):
            out[i] = subtree(trees[i], nodes)
        a = self.config.iteration_ema
        self.nodes_verified = a * sum(len(t) for t in out) + (1 - a) * self.nodes_verified
        if cost is not None and auto:
            self.used_depth = max(tree_depth(out[i]) for i in auto)
            self.used_width = max(tree_width(out[i]) for i in auto)
            drafted = max(tree_depth(trees[i]) for i in auto)
            if self.config.price_depth and drafted > 0 and self.t_draft > 0:
                kept = [out[i] for i in auto]
                self.used_depth = min(self.used_depth, max(1, priced_depth(kept, cost, self.t_draft / drafted)))
        return out

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext,
        cost: MarginalCost | None = None,
    ) -> list[list[int]]:  # fmt: skip
        """Node indices to keep per tree, spending at most ``budget`` verify tokens (roots included)."""
        raise NotImplementedError


class AdaServe(_BudgetedTrees):
    """SLO-customized speculative decoding (AdaServe Algorithm 2)."""

    name = "adaserve"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext,
        cost: MarginalCost | None = None,
    ) -> list[list[int]]:  # fmt: skip
        required = [required_tokens(r, ctx.now, self.t_spec) for r in batch]
        lost = [False] * len(batch)
        if self.config.triage:  # lost causes get throughput-optimized nodes only (module docstring)
            n_max = self.config.n_max
            lost = [not recoverable(r, ctx.now, self.t_spec, best_emission(t, n_max)) for r, t in zip(batch, trees)]
            required = [0.0 if x else a for a, x in zip(required, lost)]
        pace = self.pace(batch, lost, ctx)
        return select_slo_customized(trees, required, budget, self.config.n_max, cost, pace)

    def pace(self, batch: Sequence[Request], lost: Sequence[bool], ctx: SpecContext) -> SloPace | None:
        """A(r) with the step's time as a function of the nodes taken (``paced``; None: off or not profiled).

        T(N) = t_spec - c * (nodes a step verified lately) + c * (N + FIXED-mode nodes): the observed iteration
        time, its token-proportional part moved to this step's nodes; c = the profile's gamma. Best-effort requests,
        requests before their first token and ``lost`` ones (triaged) are not protected.
        """
        cm = ctx.cost_model
        if not self.config.paced or cm is None or cm.gamma_s <= 0 or self.t_spec <= 0:
            return None
        c = cm.gamma_s
        base: list[float | None] = []
        inv: list[float] = []
        for r, gone in zip(batch, lost):
            deficit = None if gone else behind(r, ctx.now)
            base.append(deficit)
            inv.append(0.0 if deficit is None else 1e3 / r.slo.tpot_ms)
        step_s = max(0.0, self.t_spec - c * (self.nodes_verified - self.fixed_nodes))
        return SloPace(per_token_s=c, step_s=step_s, base=tuple(base), inv_tpot=tuple(inv))


class GlobalGreedy(_BudgetedTrees):
    """AdaServe without the SLO-customized step: the globally most probable nodes (§6.3)."""

    name = "global_greedy"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext,
        cost: MarginalCost | None = None,
    ) -> list[list[int]]:  # fmt: skip
        return select_global_greedy(trees, budget, cost)


class EqualGreedy(_BudgetedTrees):
    """An equal share of the budget per request, greedy within each tree (§6.3; budget-aware Eagle-2)."""

    name = "equal_greedy"

    def choose(
        self, batch: Sequence[Request], trees: list[TokenTree], budget: int, ctx: SpecContext,
        cost: MarginalCost | None = None,
    ) -> list[list[int]]:  # fmt: skip
        return select_equal_greedy(trees, budget)  # the paper's baseline: an equal share, spent


class SpecInferTree(SpeculationPolicy):
    """A fixed tree per request (SpecInfer's expansion <1,1,3,1,1,1,1,1>), blind to load and SLOs.

    The draft expands it node by node (SpecShape.expanded, drafting.py ``ExpansionDrafter``): the top
    expansion[d] children of every node at depth d, 20 nodes for the default. A draft that only knows beams
    (prompt lookup, suffix trees) gets a beam of the expansion's depth and widest level, and the expansion is
    cut out of it (``select_expansion``): there a branch the beam did not keep is missing.
    """

    name = "specinfer"
    static_shapes = True
    # its selection only cuts the expansion out of what the draft answered: the target does the same to a relayed
    # tree (shared/engine/tree_cut.py), so the draft relay may verify it without the scheduler seeing it
    cut_by_target = True

    def __init__(self, expansion: Sequence[int] = SPECINFER_EXPANSION) -> None:
        if not expansion or min(expansion) < 1:
            raise ValueError(f"an expansion needs at least one layer and >= 1 child per node, got {expansion}")
        self.expansion = tuple(expansion)
        self.shape = SpecShape.expanded(self.expansion)

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        return [self.shape] * len(batch)

    def tree_selector(self) -> TreeSelector:
        return self

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        return [
            subtree(tree, select_expansion(tree, self.expansion)) if r.speculation.mode is SpecMode.AUTO else tree
            for r, tree in zip(batch, trees)
        ]
