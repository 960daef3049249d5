"""Packed wire forms of the step streams (docs/services.md, "Step streams"): numbers as little-endian bytes.

A step stream moves the same engine dataclasses as the unary RPCs (shared.rpc.convert), but every
number that scales with the batch travels in one bytes field per kind, batch-wide::

    trees [t0 (3 nodes), t1 (0 nodes), t2 (2 nodes)]
        num_nodes  = int32 [3, 0, 2]
        token_ids  = int32 [a, b, c,  d, e]          tree after tree
        parent_ids = int32 [-1, 0, 0, -1, 0]

so a batch costs a handful of byte copies instead of one protobuf element per number. No torch here:
the scheduler packs and unpacks with ``array``; the engines' side asks for tensors with ``relay=False``.
Malformed messages (lengths that disagree) raise ``InvalidRequestError``, as in convert.py.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from itertools import accumulate

import shared.rpc  # noqa: F401 - builds the generated code if needed
from shared.engine.errors import InvalidRequestError
from shared.engine.types import AcceptResult, PrefillItem, SparseDist, SpecItem, TokenTree
from shared.engine.features import FeatureBlock
from shared.rpc.convert import _dtype_from_pb, _features_of, _values, feature_block_to_pb, sampling_from_pb, sampling_to_pb
from shared.rpc.convert import grammar_from_pb, grammar_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, target_pb2

_SWAP = sys.byteorder != "little"  # the wire is little-endian; array is native
assert array("i").itemsize == 4 and array("f").itemsize == 4


def _pack(code: str, values: Sequence) -> bytes:
    a = array(code, values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def _unpack(code: str, data: bytes, where: str) -> list:
    a = array(code)
    if len(data) % a.itemsize:
        raise InvalidRequestError(f"{where}: {len(data)} bytes is not a whole number of {a.itemsize}-byte values")
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def pack_i32(values: Sequence[int]) -> bytes:
    return _pack("i", values)


def unpack_i32(data: bytes, where: str = "int32 field") -> list[int]:
    return _unpack("i", data, where)


def pack_f32(values: Sequence[float]) -> bytes:
    return _pack("f", values)


def unpack_f32(data: bytes, where: str = "float32 field") -> list[float]:
    return _unpack("f", data, where)


# --- prefills ----------------------------------------------------------------------------------


def stream_prefill_to_pb(item: PrefillItem) -> common_pb2.StreamPrefill:
    msg = common_pb2.StreamPrefill(seq_id=item.seq_id, prompt_ids=pack_i32(item.prompt_ids),
                                   sampling=sampling_to_pb(item.sampling), max_tokens=item.max_tokens,
                                   resume=item.resume, cache_salt=item.cache_salt)  # fmt: skip
    if item.num_prompt_tokens is not None:
        msg.num_prompt_tokens = item.num_prompt_tokens
    if item.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(item.features))
    if item.grammar is not None:
        msg.grammar.CopyFrom(grammar_to_pb(item.grammar))
    return msg


def stream_prefill_from_pb(msg: common_pb2.StreamPrefill) -> PrefillItem:
    where = f"sequence {msg.seq_id!r}"
    return PrefillItem(
        seq_id=msg.seq_id,
        prompt_ids=unpack_i32(msg.prompt_ids, f"{where} prompt_ids"),
        sampling=sampling_from_pb(msg.sampling),
        features=stream_features_from_pb(msg, where),
        max_tokens=msg.max_tokens,
        resume=msg.resume,
        cache_salt=msg.cache_salt,
        num_prompt_tokens=msg.num_prompt_tokens if msg.HasField("num_prompt_tokens") else None,
        grammar=grammar_from_pb(msg.grammar) if msg.HasField("grammar") else None,
    )


def stream_features_from_pb(msg, where: str) -> FeatureBlock | None:
    """A step-stream item's features; rows the target pushed come as a pushed block (data: the inline rows)."""
    if not msg.HasField("features") or not msg.features_pushed:
        return _features_of(msg, where)
    f = msg.features
    try:
        return FeatureBlock(f.start, f.num_rows, f.width, _dtype_from_pb(f.dtype, where), bytes(f.data), pushed=True)
    except ValueError as exc:
        raise InvalidRequestError(f"{where}: {exc}") from None


# --- trees -------------------------------------------------------------------------------------


def pack_trees(trees: Sequence[TokenTree]) -> common_pb2.PackedTrees:
    if not any(t.token_ids or t.child_dists for t in trees):  # plain decodes (the common batch): zeros
        return common_pb2.PackedTrees(num_nodes=bytes(4 * len(trees)), has_probs=bytes(len(trees)))
    num_nodes, tokens, parents, has_probs, probs = [], [], [], bytearray(), []
    num_dists, rows, sizes, dist_tokens, dist_probs = [], [], [], [], []
    for tree in trees:
        num_nodes.append(len(tree.token_ids))
        tokens += tree.token_ids
        parents += tree.parent_ids
        has_probs.append(1 if tree.draft_probs else 0)
        probs += tree.draft_probs
        if not tree.child_dists:  # greedy drafts (most): no distributions to sort through
            num_dists.append(0)
            continue
        dists = [(row, tree.child_dists[row]) for row in sorted(tree.child_dists) if tree.child_dists[row] is not None]
        num_dists.append(len(dists))
        for row, dist in dists:
            ids = _values(dist.token_ids)
            rows.append(row)
            sizes.append(len(ids))
            dist_tokens += ids
            dist_probs += _values(dist.probs)
    msg = common_pb2.PackedTrees(num_nodes=pack_i32(num_nodes), has_probs=bytes(has_probs))
    if tokens:
        msg.token_ids, msg.parent_ids = pack_i32(tokens), pack_i32(parents)
    if probs:
        msg.draft_probs = pack_f32(probs)
    if rows:
        msg.num_dists, msg.dist_rows, msg.dist_sizes = pack_i32(num_dists), pack_i32(rows), pack_i32(sizes)
        msg.dist_token_ids, msg.dist_probs = pack_i32(dist_tokens), pack_f32(dist_probs)
    return msg


_NO_DISTS = {n: (0,) * n for n in range(1, 257)}  # a batch's trees without child distributions (greedy drafts)


def unpack_trees(msg: common_pb2.PackedTrees, expected: int, *, relay: bool = False) -> list[TokenTree]:
    """``expected`` trees; ``relay``: child distributions stay lists (the scheduler), else tensors (engines)."""
    num_nodes = unpack_i32(msg.num_nodes, "trees num_nodes")
    if len(num_nodes) != expected or len(msg.has_probs) != expected:
        raise InvalidRequestError(f"packed trees: {len(num_nodes)} trees, {len(msg.has_probs)} has_probs flags, "
                                  f"for {expected} items")  # fmt: skip
    if any(n < 0 for n in num_nodes):
        raise InvalidRequestError("packed trees: a negative node count")
    total = sum(num_nodes)
    if not total and not (msg.token_ids or msg.parent_ids or msg.draft_probs or msg.dist_rows or msg.num_dists
                          or msg.dist_sizes or msg.dist_token_ids or msg.dist_probs):  # fmt: skip
        return [TokenTree() for _ in range(expected)]  # plain decodes
    tokens, parents = unpack_i32(msg.token_ids, "trees token_ids"), unpack_i32(msg.parent_ids, "trees parent_ids")
    probs = unpack_f32(msg.draft_probs, "trees draft_probs")
    with_probs = sum(n for n, flag in zip(num_nodes, msg.has_probs) if flag)
    if len(tokens) != total or len(parents) != total or len(probs) != with_probs:
        raise InvalidRequestError(f"packed trees: {total} nodes, but {len(tokens)} token_ids, {len(parents)} "
                                  f"parent_ids and {len(probs)} draft_probs (want {with_probs})")  # fmt: skip
    if not (msg.dist_rows or msg.num_dists or msg.dist_sizes or msg.dist_token_ids or msg.dist_probs):
        num_dists, rows, sizes, dist_tokens, dist_probs = _NO_DISTS.get(expected) or [0] * expected, [], [], [], []
    else:  # child distributions (sampled drafts)
        num_dists = unpack_i32(msg.num_dists, "trees num_dists") if msg.dist_rows else [0] * expected
        rows, sizes = unpack_i32(msg.dist_rows, "trees dist_rows"), unpack_i32(msg.dist_sizes, "trees dist_sizes")
        dist_tokens = unpack_i32(msg.dist_token_ids, "dist_token_ids")
        dist_probs = unpack_f32(msg.dist_probs, "dist_probs")
    if (len(num_dists) != expected or sum(num_dists) != len(rows) or len(sizes) != len(rows)
            or any(s < 0 for s in sizes) or sum(sizes) != len(dist_tokens) or len(dist_probs) != len(dist_tokens)):
        raise InvalidRequestError("packed trees: child distribution counts disagree")  # fmt: skip
    if not rows and not probs:  # greedy drafts: the trees' slices alone
        ends = accumulate(num_nodes)
        return [TokenTree(tokens[end - n : end], parents[end - n : end], [], {}) for n, end in zip(num_nodes, ends)]
    trees, at, p_at, d_at, e_at = [], 0, 0, 0, 0
    for n, flag, k in zip(num_nodes, msg.has_probs, num_dists):
        dists: dict[int, SparseDist] = {}
        for _ in range(k):
            row, size = rows[d_at], sizes[d_at]
            if not 0 <= row <= n or row in dists:
                raise InvalidRequestError(f"packed trees: child_dists row {row} outside a tree of {n} nodes or twice")
            ids, ps = dist_tokens[e_at : e_at + size], dist_probs[e_at : e_at + size]
            dists[row] = SparseDist(ids, ps) if relay else _tensor_dist(ids, ps)
            d_at, e_at = d_at + 1, e_at + size
        tree_probs = probs[p_at : p_at + n] if flag else []
        p_at += n if flag else 0
        trees.append(TokenTree(tokens[at : at + n], parents[at : at + n], tree_probs, dists))
        at += n
    return trees


def _tensor_dist(ids: list[int], probs: list[float]) -> SparseDist:
    import torch  # the engines' side only

    return SparseDist(token_ids=torch.tensor(ids, dtype=torch.int64),  # [k]
                      probs=torch.tensor(probs, dtype=torch.float32))  # [k]  # fmt: skip


# --- verification outcomes ---------------------------------------------------------------------


def pack_accepts(results: Sequence[AcceptResult]) -> target_pb2.PackedAccepts:
    num_accepted, accepted, num_tokens, tokens, status, num_pruned, pruned = [], [], [], [], [], [], []
    for r in results:
        num_accepted.append(len(r.accepted_nodes))
        accepted += r.accepted_nodes
        num_tokens.append(len(r.tokens))
        tokens += r.tokens
        status += r.node_status
        num_pruned.append(len(r.pruned_nodes))
        pruned += r.pruned_nodes
    return target_pb2.PackedAccepts(
        num_accepted=pack_i32(num_accepted), accepted_nodes=pack_i32(accepted), num_tokens=pack_i32(num_tokens),
        tokens=pack_i32(tokens), node_status=_pack("b", status), num_pruned=pack_i32(num_pruned),
        pruned_nodes=pack_i32(pruned),
    )  # fmt: skip


def unpack_accepts(msg: target_pb2.PackedAccepts, tree_sizes: Sequence[int]) -> list[AcceptResult]:
    """One result per verified tree; ``tree_sizes`` (nodes of each, from the plan) splits the node statuses."""
    n = len(tree_sizes)
    num_accepted, num_tokens = unpack_i32(msg.num_accepted, "num_accepted"), unpack_i32(msg.num_tokens, "num_tokens")
    num_pruned = unpack_i32(msg.num_pruned, "num_pruned")
    accepted, tokens = unpack_i32(msg.accepted_nodes, "accepted_nodes"), unpack_i32(msg.tokens, "tokens")
    pruned, status = unpack_i32(msg.pruned_nodes, "pruned_nodes"), _unpack("b", msg.node_status, "node_status")
    if (len(num_accepted) != n or len(num_tokens) != n or len(num_pruned) != n or sum(num_accepted) != len(accepted)
            or sum(num_tokens) != len(tokens) or sum(num_pruned) != len(pruned) or sum(tree_sizes) != len(status)
            or min([0, *num_accepted, *num_tokens, *num_pruned]) < 0):
        raise InvalidRequestError(f"packed accepts do not match the {n} verified trees")  # fmt: skip
    if not accepted and not status and not pruned and num_tokens.count(1) == n:  # plain decodes: one token each
        return [AcceptResult([], [tok], [], []) for tok in tokens]
    out, a, t, s, p = [], 0, 0, 0, 0
    for na, nt, size, npr in zip(num_accepted, num_tokens, tree_sizes, num_pruned):
        out.append(AcceptResult(accepted[a : a + na], tokens[t : t + nt], status[s : s + size], pruned[p : p + npr]))
        a, t, s, p = a + na, t + nt, s + size, p + npr
    return out


def stream_spec_item_to_pb(item: SpecItem) -> draft_pb2.StreamSpecItem:
    """A speculation request as it travels on a step stream (DraftPlan items) or a relay (RelayHandoff)."""
    msg = draft_pb2.StreamSpecItem(seq_id=item.seq_id, new_tokens=pack_i32(item.new_tokens), rollback=item.rollback)
    if item.features is not None:
        msg.features.CopyFrom(feature_block_to_pb(item.features))
        msg.features_pushed = item.features.pushed
    if item.chain_len:
        msg.chain.length = item.chain_len
        msg.chain.confidence_threshold = item.confidence_threshold
    elif item.tree_depth or item.tree_width:
        msg.tree.depth, msg.tree.width = item.tree_depth, item.tree_width
        msg.tree.expansion.extend(item.tree_expansion)
    return msg
