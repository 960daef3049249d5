"""What a speculation policy decides per request (SpecShape) and what it may know of the step (SpecContext).

Plain data shared by the policies (speculation.py), the tree selectors
(selection.py) and the step report (report.py); it imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from shared.engine.spec_checks import expansion_widths
from shared.engine.types import SpecItem

if TYPE_CHECKING:
    from shared.profiling.cost_model import CostModel


@dataclass(frozen=True)
class SpecShape:
    """What to ask of the draft for one request: nothing, a chain of k, or a d x w tree."""

    kind: Literal["none", "chain", "tree"] = "none"
    k: int = 0  # chain length
    depth: int = 0  # tree depth d
    width: int = 0  # tree width w
    confidence_threshold: float = 0.0  # chain early stop (SmartSpec App. A); 0 = off
    expansion: tuple[int, ...] = ()  # a tree by per-node top-k expansion (SpecInfer), not a beam; width = widest level

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

    @staticmethod
    def expanded(expansion: tuple[int, ...]) -> SpecShape:
        """SpecInfer's tree: ``expansion[d]`` children of every node at depth d (the draft's most probable)."""
        if not expansion or min(expansion) < 1:
            raise ValueError(f"an expansion needs at least one level and >= 1 child per node, got {expansion}")
        expansion = tuple(int(k) for k in expansion)
        return SpecShape("tree", depth=len(expansion), width=max(expansion_widths(expansion)), expansion=expansion)

    @property
    def speculates(self) -> bool:
        return self.kind != "none"

    @property
    def max_depth(self) -> int:
        """Longest path, i.e. the most draft tokens one step can accept."""
        return self.k if self.kind == "chain" else self.depth if self.kind == "tree" else 0

    @property
    def max_nodes(self) -> int:
        if self.expansion:
            return sum(expansion_widths(self.expansion))
        return self.k if self.kind == "chain" else self.depth * self.width if self.kind == "tree" else 0

    def capped(self, max_depth: int) -> SpecShape:
        if max_depth >= self.max_depth:
            return self
        if self.kind == "chain":
            return SpecShape.chain(max_depth, self.confidence_threshold)
        if self.expansion:
            return SpecShape.expanded(self.expansion[:max_depth]) if max_depth > 0 else _NONE
        return SpecShape.tree(max_depth, self.width)

    def spec_item(self, seq_id: str, new_tokens: list[int], rollback: int = 0) -> SpecItem:
        """``rollback``: tokens the draft holds beyond the true prefix (a frontier chunk, FASER §4.3) to drop first."""
        if self.kind == "chain":
            return SpecItem(seq_id, new_tokens, chain_len=self.k, confidence_threshold=self.confidence_threshold,
                            rollback=rollback)  # fmt: skip
        if self.kind == "tree":
            return SpecItem(seq_id, new_tokens, tree_depth=self.depth, tree_width=self.width,
                            tree_expansion=self.expansion, rollback=rollback)  # fmt: skip
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
    max_tokens_in_flight: int | None = None  # the KV token budget admission fills (SmartSpec Alg. 2's HasSlot)
