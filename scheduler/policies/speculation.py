"""How much to speculate, per request, per iteration (DESIGN §2 step 3, §5).

A policy looks at the whole batch (costs depend on batch size) and returns one
``SpecShape`` per request. ``plan_shapes`` then applies what is not the
policy's call:

    mode OFF          -> none
    mode FIXED k      -> chain k           (overrides the policy)
    mode AUTO         -> the policy's shape
    draft unavailable -> none for everybody (the policy is not asked)
    any shape         -> depth capped at num_remaining - 1 (the bonus token fills the last slot)

Room for the papers, all as subclasses of ``SpeculationPolicy``:
- SmartSpec / Nightjar / FASER choose a chain length per batch or per request
  in ``decide`` and learn from ``observe`` (each ``StepReport`` carries the
  phase timings and per-request accepted lengths they need); SmartSpec's
  prefill-disabling rule is ``wants_draft`` (``smartspec.py``, ``faser.py``).
  What they learn lives in a ``SharedState`` (``shared_state``), which the
  scheduler process keeps in Redis.
- AdaServe returns ``SpecShape.tree(d, w)`` (eq. 8-9) here and prunes the
  candidate trees under the budget in the ``TreeSelector`` its
  ``tree_selector`` returns (``adaserve.py``, ``selection.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from scheduler.request import Request, SpecMode
from shared.engine.types import SpecItem

if TYPE_CHECKING:
    from scheduler.policies.selection import TreeSelector
    from scheduler.report import StepReport
    from scheduler.policies.shared_state import SharedState
    from shared.profiling.cost_model import CostModel


@dataclass(frozen=True)
class SpecShape:
    """What to ask of the draft for one request: nothing, a chain of k, or a d x w tree."""

    kind: Literal["none", "chain", "tree"] = "none"
    k: int = 0  # chain length
    depth: int = 0  # tree depth d
    width: int = 0  # tree width w
    confidence_threshold: float = 0.0  # chain early stop (SmartSpec App. A); 0 = off

    @staticmethod
    def none() -> SpecShape:
        return _NONE

    @staticmethod
    def chain(k: int, confidence_threshold: float = 0.0) -> SpecShape:
        if k < 0:
            raise ValueError(f"chain length must be >= 0, got {k}")
        return SpecShape("chain", k=k, confidence_threshold=confidence_threshold) if k > 0 else _NONE

    @staticmethod
    def tree(depth: int, width: int) -> SpecShape:
        if depth < 0 or width < 0:
            raise ValueError(f"tree depth and width must be >= 0, got {depth} x {width}")
        return SpecShape("tree", depth=depth, width=width) if depth > 0 and width > 0 else _NONE

    @property
    def speculates(self) -> bool:
        return self.kind != "none"

    @property
    def max_depth(self) -> int:
        """Longest path, i.e. the most draft tokens one step can accept."""
        return self.k if self.kind == "chain" else self.depth if self.kind == "tree" else 0

    @property
    def max_nodes(self) -> int:
        return self.k if self.kind == "chain" else self.depth * self.width if self.kind == "tree" else 0

    def capped(self, max_depth: int) -> SpecShape:
        if max_depth >= self.max_depth:
            return self
        if self.kind == "chain":
            return SpecShape.chain(max_depth, self.confidence_threshold)
        return SpecShape.tree(max_depth, self.width)

    def spec_item(self, seq_id: str, new_tokens: list[int]) -> SpecItem:
        if self.kind == "chain":
            return SpecItem(seq_id, new_tokens, chain_len=self.k, confidence_threshold=self.confidence_threshold)
        if self.kind == "tree":
            return SpecItem(seq_id, new_tokens, tree_depth=self.depth, tree_width=self.width)
        raise ValueError("SpecShape.none() has no SpecItem")


_NONE = SpecShape()


@dataclass(frozen=True)
class SpecContext:
    """What a policy may know about the iteration besides the requests."""

    now: float  # seconds on the scheduler's clock
    step: int  # iteration number
    draft_available: bool
    token_budget: int | None = None  # AdaServe's B (verify tokens before compute-bound), when profiled
    cost_model: CostModel | None = None  # the target's T_fwd (SmartSpec eq. 7), when profiled
    draft_cost_model: CostModel | None = None  # the draft's T_fwd per forward, when profiled


class SpeculationPolicy:
    """Base class; subclasses override ``decide`` and optionally ``wants_draft``/``observe``.

    Must stay pure: read ``Request`` fields, never mutate them, no I/O.
    """

    name = "base"

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        """One shape per request of ``batch`` (all of it, also OFF/FIXED requests, which get overridden)."""
        raise NotImplementedError

    def wants_draft(self, req: Request) -> bool:
        """Prefill this AUTO-mode request on the draft at admission? (If not, and ``decide`` later
        speculates for it, the loop prefills it on the draft first.)"""
        return True

    def observe(self, report: StepReport) -> None:
        """Called after every iteration with its outcome (for learning policies)."""
        return None

    def tree_selector(self) -> TreeSelector | None:
        """The selector that prunes this policy's trees (AdaServe's), used when the scheduler is given
        none; None = verify every drafted node."""
        return None

    def shared_state(self) -> SharedState | None:
        """What this policy learns, to be kept in Redis and shared by replicas (None: nothing to keep)."""
        return None


class NoSpeculation(SpeculationPolicy):
    """Plain decoding: one target token per step."""

    name = "none"

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        return [_NONE] * len(batch)

    def wants_draft(self, req: Request) -> bool:
        return False


class FixedChain(SpeculationPolicy):
    """Every request drafts a chain of ``k`` tokens every step."""

    name = "fixed_chain"

    def __init__(self, k: int, confidence_threshold: float = 0.0) -> None:
        if k < 1:
            raise ValueError(f"FixedChain needs k >= 1, got {k}; use NoSpeculation for k = 0")
        self.shape = SpecShape.chain(k, confidence_threshold)

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        return [self.shape] * len(batch)


def wants_draft(policy: SpeculationPolicy, req: Request) -> bool:
    """Should the draft hold ``req`` from admission on (request mode first, then the policy)?"""
    mode = req.speculation.mode
    if mode is SpecMode.OFF:
        return False
    if mode is SpecMode.FIXED:
        return True
    return policy.wants_draft(req)


def plan_shapes(policy: SpeculationPolicy, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
    """The final shape per request: the policy's choice with request overrides and caps applied."""
    if not ctx.draft_available or not batch:
        return [_NONE] * len(batch)
    chosen = policy.decide(batch, ctx)
    if len(chosen) != len(batch):
        raise ValueError(f"{type(policy).__name__}.decide returned {len(chosen)} shapes for {len(batch)} requests")
    out = []
    for req, shape in zip(batch, chosen):
        mode = req.speculation.mode
        if mode is SpecMode.OFF:
            shape = _NONE
        elif mode is SpecMode.FIXED:
            shape = SpecShape.chain(req.speculation.k)
        out.append(shape.capped(max(0, req.num_remaining - 1)))
    return out
