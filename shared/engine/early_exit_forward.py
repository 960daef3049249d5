"""Token-wise early exit inside a forward (FASER §4.2): the decoder layer by layer, pruning tree nodes.

    hidden = forward_early_exit(runner, ids, pos, layout, candidates, ctrl, pruned)   # [T, hidden]

The runner (runner.py) packs the batch and names the fresh tree nodes that may be pruned
(``candidates``); this walks the layers, checks the candidates at the controller's layers and drops
the rows of pruned nodes and their subtrees from the rest of the forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from shared.engine.attention.base import BatchLayout, SeqLayout
from shared.engine.early_exit import PRUNE, SHADOW, SKIP, EarlyExitController
from shared.engine.sequence import Sequence

if TYPE_CHECKING:
    from shared.engine.runner import ModelRunner


@dataclass
class Candidate:
    """A fresh tree node early exit may prune: its packed row, its parent's row and its subtree."""

    work: int
    node: int  # index in the work's tree
    row: int  # packed row of the node
    parent_row: int  # packed row whose logits predict this node's token
    token: int
    subtree: list["Candidate"] = field(default_factory=list)  # the node and its descendants


def tree_candidates(work: int, seq: Sequence, first_row: int, tokens: torch.Tensor) -> list[Candidate]:
    """Candidates of a tree fed right after its root row (``first_row - 1``); node j sits at ``first_row + j``."""
    out: list[Candidate] = []
    for j, (token, parent) in enumerate(zip(tokens.tolist(), seq.tree.parent_ids)):
        parent_row = first_row - 1 if parent < 0 else first_row + parent
        out.append(Candidate(work, j, first_row + j, parent_row, token))
    for c in out:
        node = c.node
        while node >= 0:  # c lies in the subtree of each of its ancestors (and its own)
            out[node].subtree.append(c)
            node = seq.tree.parent_ids[node]
    return out


def _shrink(layout: BatchLayout, alive: torch.Tensor, device: torch.device) -> BatchLayout:
    """The layout with the rows of pruned nodes removed (their KV slots stay allocated but are no longer written)."""
    seqs: list[SeqLayout] = []
    q_start = 0
    for s in layout.seqs:
        keep = alive[s.q_start : s.q_start + s.q_len]  # [q_len]
        q_len = int(keep.sum())
        seqs.append(SeqLayout(q_start, q_len, s.kv_slots, s.mask[keep], causal=s.causal and q_len == s.q_len))
        q_start += q_len
    return BatchLayout(seqs=seqs, new_slots=layout.new_slots[alive.to(layout.new_slots.device)], num_tokens=q_start, device=device)


def forward_early_exit(
    runner: "ModelRunner",
    ids: torch.Tensor,
    pos: torch.Tensor,
    layout: BatchLayout,
    candidates: list[Candidate],
    ctrl: EarlyExitController,
    pruned: list[list[int]],
    flags: list[list[tuple[int, int, bool]]] | None = None,
) -> torch.Tensor:
    """The decoder layer by layer, dropping the rows of pruned tree nodes (FASER §4.2). Returns [T, hidden].

    Rows that stopped early come back as zeros: their logits are not valid
    and the caller must not read them (``pruned`` names them per work).
    ``flags`` gets (node, layer, pruned) per work for every node a check put outside its top-K.
    """
    dec = runner.decoder
    num_tokens = ids.shape[1]
    num_layers = len(dec.layers)
    ctrl.begin_forward(num_tokens)
    alive = torch.ones(num_tokens, dtype=torch.bool)  # [T] packed rows still running
    gone: set[int] = set()  # the same, as the packed rows pruned
    rows = torch.arange(num_tokens)  # [T'] packed row of each running row
    hidden = dec.embed_tokens(ids)  # [1, T', hidden]
    cos, sin = dec.rotary_emb(hidden, position_ids=pos)  # [1, T', head_dim] each
    start = time.perf_counter()
    overhead = 0.0
    token_layers = 0
    for layer_idx, layer in enumerate(dec.layers[: num_layers]):
        hidden = layer(
            hidden, position_embeddings=(cos, sin), position_ids=pos, use_cache=False, tandem_backend=runner.backend
        )
        token_layers += int(rows.numel())
        if layer_idx not in ctrl.layers:
            continue  # no check here: skip the per-candidate bookkeeping (64 candidates x 30 layers adds up)
        live = [c for c in candidates if c.row not in gone]
        parent_rows = sorted({c.parent_row for c in live})
        if not live:
            continue
        depth_below = sum(len(c.subtree) - 1 for c in live) / len(live)
        mode = ctrl.decide(layer_idx, len(parent_rows), live=len(live), depth_below=depth_below)
        if mode == SKIP:
            continue
        t0 = time.perf_counter()
        where = torch.full((num_tokens,), -1, dtype=torch.long)  # packed row -> running row
        where[rows] = torch.arange(rows.numel())
        parent_idx = where[torch.tensor(parent_rows)]
        capture = runner._capture
        if capture is not None:
            capture.paused = True  # this norm is the exit test's, not the last layer's output
        parent_hidden = hidden[0, parent_idx.to(runner.device)]  # [P, hidden]
        slot = {r: i for i, r in enumerate(parent_rows)}
        pidx = torch.tensor([slot[c.parent_row] for c in live], device=runner.device)  # [C]
        tok = torch.tensor([c.token for c in live], device=runner.device)  # [C]
        # outside the top-K_l <=> at least K_l tokens score higher (no top-k materialised; FASER §5)
        if runner.exit_lens is not None:  # tuned lens, maybe over a vocabulary subset (tuned_lens.py)
            higher = runner.exit_lens.tokens_above(layer_idx, parent_hidden, dec.norm, runner.lm_head, pidx, tok).cpu()
        else:
            logits = runner.lm_head(dec.norm(parent_hidden)).float()  # [P, vocab]
            own = logits[pidx, tok]  # [C]
            higher = (logits[pidx] > own[:, None]).sum(-1).cpu()  # [C]
        if capture is not None:
            capture.paused = False
        out = [c for c, h in zip(live, higher.tolist()) if h >= ctrl.k_at(layer_idx)]
        t1 = time.perf_counter()
        ctrl.observe_check(t1 - t0, len(parent_rows))
        overhead += t1 - t0
        if flags is not None:
            for c in out:
                flags[c.work].append((c.node, layer_idx, mode == PRUNE))
        if not out or mode == SHADOW:
            continue  # a shadow check measures: the flagged nodes run on, the walk says if they would pass
        removed = 0
        for c in out:
            for d in c.subtree:
                if d.row not in gone:
                    gone.add(d.row)
                    alive[d.row] = False
                    removed += 1
                    pruned[d.work].append(d.node)
        keep = alive[rows]  # [T']
        rows = rows[keep]
        if runner._capture is not None:
            runner._capture.rows = rows
        keep_dev = keep.to(runner.device)
        hidden, pos, cos, sin = hidden[:, keep_dev], pos[:, keep_dev], cos[:, keep_dev], sin[:, keep_dev]
        runner.backend.plan(_shrink(layout, alive, runner.device))
        t2 = time.perf_counter()
        ctrl.observe_prune(t2 - t1, removed)
        overhead += t2 - t1
    hidden = dec.norm(hidden)[0]  # [T', hidden]
    full = hidden.new_zeros(num_tokens, hidden.shape[-1])  # [T, hidden]
    full[rows.to(runner.device)] = hidden
    ctrl.observe_forward(time.perf_counter() - start - overhead, token_layers)
    for nodes in pruned:
        nodes.sort()
    return full
