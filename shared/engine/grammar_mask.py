"""Where grammar masks enter drafting and verification (the state itself: grammar.py).

    draft   every drafting forward: logits of row r masked by the state after r's path, so greedy,
            sampled (q is the masked distribution) and beam drafts propose only valid tokens;
            what a beam still picks at probability 0 is pruned before the tree leaves (prune_draft)
    target  the tree is pruned of invalid nodes before the forward (a model-free draft never saw the
            grammar); then every row's logits are masked by the state after the path to that row,
            before greedy argmax or rejection sampling, so acceptance is lossless with respect to
            the constrained target distribution p'(x) = p(x) 1[x allowed] / sum of allowed p

A mask is one bit per token (llguidance's int32 words, ``[rows, words]``); it goes to the logits'
device as is and is unpacked there. A sequence without a grammar passes through untouched.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np
import torch

from shared.engine.acceptance import REJECTED
from shared.engine.errors import InvalidRequestError
from shared.engine.grammar import GrammarBook, GrammarState
from shared.engine.sequence import Sequence
from shared.engine.types import AcceptResult, PrefillItem, TokenTree, VerifyItem

_SHIFTS: dict[torch.device, torch.Tensor] = {}


def compile_prefills(book: GrammarBook | None, items: Seq[PrefillItem], required: bool = True) -> dict[str, GrammarState]:
    """A fresh state per prefill that carries a grammar, keyed by seq_id; raises before anything is added.
    The first chunk of a chunked prefill carries the whole prompt, so the state is built then and first
    used when the prefill completes (the grammar starts at the prompt's end).

    ``required`` False (a draft): without a tokenizer the draft proposes freely, and the target's pruning
    and masks keep the output exact."""
    states = {}
    for item in items:
        if item.grammar is None or item.resume or (book is None and not required):
            continue  # a resumed chunk's sequence has its state from the first chunk
        if book is None:
            raise InvalidRequestError(f"sequence {item.seq_id!r}: structured output needs the model's tokenizer, "
                                      "and this model service has none")  # fmt: skip
        state = book.state(item.grammar)
        if not all(state.valid_nodes(item.prompt_ids, [], [])):
            raise InvalidRequestError(f"sequence {item.seq_id!r}: its tokens after grammar start "
                                      f"{item.grammar.start} are not allowed by the grammar")  # fmt: skip
        states[item.seq_id] = state
    return states


def disallowed(bitmask: np.ndarray, num_columns: int, device: torch.device,
               vocab_ids: torch.Tensor | None = None) -> torch.Tensor | np.ndarray:  # fmt: skip
    """Bool ``[rows, num_columns]``, True where the token's bit is clear in the row's mask (column c is
    ``vocab_ids[c]`` for a reduced head; columns past the tokenizer's vocabulary are never allowed).

    On a CPU a numpy array: numpy's unpack and select are single-threaded passes, where torch's
    parallel elementwise ops cost 10x more on a CPU that other work keeps busy. Elsewhere a device
    tensor: the words cross as they are (4 bytes per 32 tokens) and are unpacked there.
    """
    if device.type == "cpu":
        dis = np.unpackbits((~bitmask).view(np.uint8), axis=1, bitorder="little").view(np.bool_)  # [rows, 32 * words]
        if vocab_ids is not None:
            ids = vocab_ids.cpu().numpy()
            return dis[:, np.minimum(ids, dis.shape[1] - 1)] | (ids >= dis.shape[1])
        if dis.shape[1] >= num_columns:
            return dis[:, :num_columns]
        return np.concatenate([dis, np.ones((dis.shape[0], num_columns - dis.shape[1]), dtype=np.bool_)], axis=1)
    words = torch.from_numpy(bitmask).to(device, non_blocking=True)  # [rows, words] int32
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)  # [32]
    dis = (((words[:, :, None] >> shifts) & 1) == 0).flatten(1)  # [rows, 32 * words]
    if vocab_ids is not None:
        return dis[:, vocab_ids.clamp_max(dis.shape[1] - 1)] | (vocab_ids >= dis.shape[1])
    if dis.shape[1] >= num_columns:
        return dis[:, :num_columns]
    pad = torch.ones(dis.shape[0], num_columns - dis.shape[1], dtype=torch.bool, device=device)
    return torch.cat([dis, pad], dim=1)


def mask_logits(logits: torch.Tensor, state: GrammarState, committed: list[int], tree: TokenTree,
                rows: list[int] | None = None, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """``logits`` ``[len(rows), columns]`` (default rows: all ``1 + len(tree)``) with disallowed tokens at -inf.

    A row that allows none of its columns (a reduced draft head without any allowed token) stays as it
    was: its pick is pruned afterwards."""
    bitmask, _ = state.masks(committed, tree.token_ids, tree.parent_ids, rows)
    dis = disallowed(bitmask, logits.shape[-1], logits.device, vocab_ids)  # [rows, columns]
    if isinstance(dis, np.ndarray):
        dis &= ~dis.all(axis=1, keepdims=True)
        return torch.from_numpy(np.where(dis, np.float32(-np.inf), logits.float().numpy()))
    dis &= ~dis.all(dim=1, keepdim=True)
    return logits.float().masked_fill(dis, float("-inf"))


def constrain_tree(seq: Sequence, tree: TokenTree, logits: torch.Tensor) -> torch.Tensor:
    """The target's rows ``[1 + num_nodes, vocab]`` masked per row; unchanged without a grammar."""
    if seq.grammar is None:
        return logits
    return mask_logits(logits, seq.grammar, seq.token_ids, tree)


def constrain_draft(seq: Sequence, tree: TokenTree, num_rows: int, root: bool, logits: torch.Tensor,
                    vocab_ids: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """A drafting forward's ``logits`` ``[num_rows, columns]``: the root's row, or the rows of the tree's
    newest ``num_rows`` nodes (what every drafter runs next: a chain's last node, a beam, a layer)."""
    if seq.grammar is None:
        return logits
    rows = [0] if root else list(range(len(tree) - num_rows + 1, len(tree) + 1))
    return mask_logits(logits, seq.grammar, seq.token_ids, tree, rows, vocab_ids)


def prune_draft(seq: Sequence, tree: TokenTree) -> TokenTree:
    """``tree`` without the nodes the grammar rejects (and their subtrees)."""
    if seq.grammar is None or not len(tree):
        return tree
    return prune(tree, seq.grammar.valid_nodes(seq.token_ids, tree.token_ids, tree.parent_ids))[0]


def prune(tree: TokenTree, ok: list[bool]) -> tuple[TokenTree, list[int]]:
    """(the subtree of nodes with ok[i] (an invalid node's subtree goes too), old index of each kept node)."""
    kept: list[int] = []
    new_of: dict[int, int] = {}
    for node, parent in enumerate(tree.parent_ids):
        if ok[node] and (parent < 0 or parent in new_of):
            new_of[node] = len(kept)
            kept.append(node)
    if len(kept) == len(tree):
        return tree, kept
    out = TokenTree(
        token_ids=[tree.token_ids[i] for i in kept],
        parent_ids=[new_of[tree.parent_ids[i]] if tree.parent_ids[i] >= 0 else -1 for i in kept],
        draft_probs=[tree.draft_probs[i] for i in kept] if tree.draft_probs else [],
    )
    for row, dist in tree.child_dists.items():  # row 0: the root; row i + 1: node i
        if row == 0:
            out.child_dists[0] = dist
        elif row - 1 in new_of:
            out.child_dists[new_of[row - 1] + 1] = dist
    return out, kept


def prune_verifies(seqs: dict[str, Sequence], verifies: list[VerifyItem]) -> tuple[list[VerifyItem], list]:
    """The items with each grammar sequence's tree pruned, and per item the kept old indices (None: whole)."""
    out, kept_all = [], []
    for v in verifies:
        seq = seqs[v.seq_id]
        if seq.grammar is None or not len(v.tree):
            out.append(v)
            kept_all.append(None)
            continue
        ok = seq.grammar.valid_nodes(seq.token_ids, v.tree.token_ids, v.tree.parent_ids)
        tree, kept = prune(v.tree, ok)
        out.append(v if tree is v.tree else VerifyItem(v.seq_id, tree))
        kept_all.append(None if tree is v.tree else (kept, len(v.tree)))
    return out, kept_all


def unprune(results: list[AcceptResult], kept_all: list) -> list[AcceptResult]:
    """Results in the trees' original node numbering; nodes pruned for the grammar count as rejected."""
    for result, kept in zip(results, kept_all):
        if kept is None:
            continue
        old, num_nodes = kept
        status = [REJECTED] * num_nodes
        for new, s in enumerate(result.node_status):
            status[old[new]] = s
        result.node_status = status
        result.accepted_nodes = [old[j] for j in result.accepted_nodes]
        result.pruned_nodes = [old[j] for j in result.pruned_nodes]
    return results
