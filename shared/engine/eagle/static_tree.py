"""Greedy EAGLE-3 beam and expansion trees with one host read: every level's forward in one body.

The token draft's static tree (draft_tree_step.py) with the head's inputs and outputs
(static_inputs.py): forward 0 runs the fed committed positions with their input rows; a
level's forward feeds each node the head's output at its parent (the root's for level 0,
else the previous level's output at the parent's place in it, gathered on the device),
picks children over the draft vocabulary and maps them to target ids. The root's and
every run node's outputs stay on the device for the sequence's tree outputs.
"""

from __future__ import annotations

import torch

from shared.engine.draft_tree_step import DraftTreeStep, TreeShape
from shared.engine.eagle.static_inputs import EagleInputs
from shared.engine.step_plan import StepShape


class EagleTreeStep(EagleInputs, DraftTreeStep):
    what = "EAGLE draft tree"

    def body(self, flat: torch.Tensor, shape: TreeShape) -> torch.Tensor:
        self._room(shape.first.rows, shape.batch, 1 + shape.nodes_run)  # eager steps only (buckets fit)
        self._levels: list[torch.Tensor] = []  # [B, 1, H] the root's output, then [B, L, H] per level run
        return super().body(flat, shape)

    def _root_logits(self, seg: dict[str, torch.Tensor], first: StepShape) -> torch.Tensor:
        self.attn.prepare(seg, first.kv_cap)
        h = self._head(seg["ids"], self.feats[: first.rows], seg["pos"])[seg["root_row"]]  # [B, H]
        self._levels = [h[:, None]]
        return self._head_logits(h)

    def _level_logits(self, ids: torch.Tensor, pos: torch.Tensor, above: torch.Tensor | None) -> torch.Tensor:
        last = self._levels[-1]  # [B, L', H] the outputs of the level above (the root's: L' = 1)
        batch, hidden = last.shape[0], last.shape[2]
        width = ids.shape[0] // batch  # L: nodes of the level run now
        if above is None:
            feats = last.expand(batch, width, hidden)  # every level-0 node's parent is the root
        else:
            feats = last.gather(1, above[:, :, None].expand(batch, width, hidden))  # [B, L, H]
        out = self._head(ids, feats.reshape(-1, hidden), pos)  # [B * L, H]
        self._levels.append(out.view(batch, width, hidden))
        return self._head_logits(out)

    def _level_outputs(self, shape: TreeShape) -> None:
        self._keep_outputs(torch.cat(self._levels, 1))  # [B, 1 + nodes run, H]
