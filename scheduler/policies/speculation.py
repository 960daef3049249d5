"""How much to speculate, per request, per iteration (architecture.md §2 step 3, §5).

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

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scheduler.request import Request, SpecMode
from scheduler.spec_shape import _NONE, SpecContext, SpecShape

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from scheduler.policies.selection import TreeSelector
    from scheduler.policies.shared_state import SharedState
    from scheduler.report import StepReport

__all__ = ["SpecContext", "SpecShape", "SpeculationPolicy", "NoSpeculation", "FixedChain", "plan_shapes", "wants_draft"]


class SpeculationPolicy:
    """Base class; subclasses override ``decide`` and optionally ``wants_draft``/``observe``.

    Must stay pure: read ``Request`` fields, never mutate them, no I/O.
    """

    name = "base"

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        """One shape per request of ``batch`` (all of it, also OFF/FIXED requests, which get overridden)."""
        raise NotImplementedError

    def step_batch(self, batch: Sequence[Request], ctx: SpecContext) -> Sequence[Request]:
        """The running requests this step runs (SmartSpec Algorithm 2 lines 2-11 may run a prefix of them);
        the others keep their place and KV and wait a step. By default: all of them."""
        return batch

    def wants_draft(self, req: Request) -> bool:
        """Prefill this AUTO-mode request on the draft at admission? (If not, and ``decide`` later
        speculates for it, the loop prefills it on the draft first.)"""
        return True

    def observe(self, report: StepReport) -> None:
        """Called after every iteration with its outcome (for learning policies)."""
        return None

    # the same shape for a request every step, whatever the outcomes (then a verify may go ahead: verify_ahead.py)
    static_shapes = False

    def tree_selector(self) -> TreeSelector | None:
        """The selector that prunes this policy's trees (AdaServe's), used when the scheduler is given
        none; None = verify every drafted node."""
        return None

    def shared_state(self) -> SharedState | None:
        """What this policy learns, to be kept in Redis and shared by replicas (None: nothing to keep)."""
        return None

    def explain(self) -> dict[str, float]:
        """What the last ``decide`` rested on (estimates, modelled costs), as numbers for the step's trace
        attributes (``tandem.policy.<key>`` on its commit spans); empty by default."""
        return {}


def explained(policy: SpeculationPolicy) -> dict[str, float]:
    """``policy.explain()`` for the traces: a failing one is logged and never costs the step."""
    try:
        return policy.explain()
    except Exception:  # noqa: BLE001
        log.exception("speculation policy's explain failed")
        return {}


class NoSpeculation(SpeculationPolicy):
    """Plain decoding: one target token per step."""

    name = "none"
    static_shapes = True

    def decide(self, batch: Sequence[Request], ctx: SpecContext) -> list[SpecShape]:
        return [_NONE] * len(batch)

    def wants_draft(self, req: Request) -> bool:
        return False


class FixedChain(SpeculationPolicy):
    """Every request drafts a chain of ``k`` tokens every step."""

    name = "fixed_chain"
    static_shapes = True

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


def step_batch(policy: SpeculationPolicy, batch: list, ctx: SpecContext, running) -> list:
    """The requests this step runs: the policy's choice among ``batch`` (SmartSpec Algorithm 2 runs a FCFS
    prefix), or the whole batch when the draft is out or the choice is empty or names a request not running."""
    if not (ctx.draft_available and batch):
        return batch
    chosen = list(policy.step_batch(batch, ctx))
    return chosen if chosen and all(r.id in running for r in chosen) else batch
