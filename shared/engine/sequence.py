"""One sequence as a model service holds it: committed tokens, KV progress, speculative tree.

::

    logical KV positions of a sequence with n committed tokens and a tree of m nodes

    0 .. num_cached-1 | num_cached .. n-1 | n .. n+m-1
    committed, in KV  | committed, not    | speculative tree nodes, node j at n + j
                      | yet in KV         | (position id n + depth(j), not n + j)

Only the model runner mutates KV-related fields; commit() moves the accepted
root-to-node path of the tree down to n, n+1, ... and drops the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shared.engine.step_plan import ancestors
from shared.engine.types import SamplingParams


@dataclass
class SpecTree:
    """The speculative nodes of a sequence that are in its KV cache."""

    token_ids: list[int] = field(default_factory=list)
    parent_ids: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    # anc[i, j]: j is i or an ancestor of i.  [capacity, capacity] bool, grown by doubling
    anc: torch.Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.bool))
    # nodes early exit stopped before the last layer: their KV is incomplete, so commit never reuses it
    pruned: set[int] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.token_ids)

    def add(self, token_id: int, parent_id: int) -> int:
        j = len(self.token_ids)
        if j >= self.anc.shape[0]:
            grown = torch.zeros(max(8, 2 * j), max(8, 2 * j), dtype=torch.bool)
            grown[:j, :j] = self.anc[:j, :j]
            self.anc = grown
        self.anc[j] = False  # rows are reused across trees: clear what an earlier tree left
        if parent_id >= 0:
            self.anc[j, :j] = self.anc[parent_id, :j]
        self.anc[j, j] = True
        self.token_ids.append(token_id)
        self.parent_ids.append(parent_id)
        self.depths.append(0 if parent_id < 0 else self.depths[parent_id] + 1)
        return j

    def add_nodes(self, token_ids: list[int], parent_ids: list[int]) -> None:
        """Nodes 0..m-1 of an empty tree at once (parents precede children): the ancestor bits in one write."""
        if self.token_ids:
            raise ValueError("add_nodes starts a tree: this one has nodes")
        m = len(token_ids)
        if not m:
            return
        anc, depths = ancestors(parent_ids)  # [m, m] uint8
        if m > self.anc.shape[0]:
            self.anc = torch.zeros(max(8, 2 * m), max(8, 2 * m), dtype=torch.bool)
        self.anc[:m] = False
        self.anc[:m, :m] = torch.from_numpy(anc).bool()
        self.token_ids.extend(token_ids)
        self.parent_ids.extend(parent_ids)
        self.depths.extend(depths)

    def child(self, parent_id: int, token_id: int) -> int | None:
        for j, (p, t) in enumerate(zip(self.parent_ids, self.token_ids)):
            if p == parent_id and t == token_id and j not in self.pruned:
                return j
        return None

    def clear(self) -> None:
        self.token_ids.clear()
        self.parent_ids.clear()
        self.depths.clear()
        self.pruned.clear()


@dataclass
class Sequence:
    seq_id: str
    token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    generator: torch.Generator | None = None
    num_cached: int = 0
    block_ids: list[int] = field(default_factory=list)
    tree: SpecTree = field(default_factory=SpecTree)
    # prefix caching (prefix_blocks.py): its tenant's salt, None = never shared; the keys of its full blocks
    cache_salt: str | None = ""
    block_keys: list[bytes] = field(default_factory=list)
    # target feature rows stored beside the KV (block_features.py, prefix_features.py): committed positions
    # 0 .. feature_rows-1 and tree nodes 0 .. tree_feature_rows-1 have theirs
    feature_rows: int = 0
    tree_feature_rows: int = 0
    output_start: int = 0  # token_ids[output_start:] are the request's output (penalties, min_tokens)
    logits_processors: list = field(default_factory=list)  # logits_process.LogitsProcessor, applied in order
    grammar: object | None = None  # grammar.GrammarState: structured output follows the committed tokens

    @property
    def num_committed(self) -> int:
        return len(self.token_ids)

    @property
    def num_logical(self) -> int:
        """KV positions in use: committed tokens plus speculative nodes."""
        return len(self.token_ids) + len(self.tree)
