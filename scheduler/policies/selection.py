"""Which drafted nodes to verify (DESIGN §2 step 5).

The draft returns candidate trees; a selector may prune each to a subtree
(keeping every kept node's parent) so that the batch fits the verify token
budget B. AdaServe's SLO-customized then throughput-optimized selection
(Algorithm 2) is a ``TreeSelector``; the default keeps everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler.policies.speculation import SpecContext
from scheduler.request import Request
from shared.engine.types import TokenTree


class TreeSelector(Protocol):
    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        """One tree per request (empty = plain decode); each a subtree of the candidate, parents first."""
        ...


class PassThrough:
    """Verify every drafted node."""

    def select(self, batch: Sequence[Request], trees: list[TokenTree], ctx: SpecContext) -> list[TokenTree]:
        return trees
