"""A draft plan's chain items as columns: what most speculative steps send (docs/services.md, "Step streams").

    items [SpecItem(a, [5, 6], chain_len=4), SpecItem(b, [7], chain_len=4, rollback=2)]
        seq_ids        = [a, b]
        num_new_tokens = int32 [2, 1]
        new_tokens     = int32 [5, 6, 7]
        chain_lengths  = int32 [4, 4]
        rollbacks      = int32 [0, 2]          (empty when all are 0; confidence_thresholds likewise)

One message with a handful of fields for the whole batch, instead of a StreamSpecItem (and its chain
message) per item: at batch 64 building and parsing those took ~0.4 ms a step. Items that all draft one
fixed expansion tree (SpecInfer's) pack too: ``tree_expansion`` once, ``chain_lengths`` 1 where an item
drafts. Only items without features pack, all chains or all of one expansion; a plan with any other keeps
``items`` (``pack_chain_items`` says None).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from shared.engine.errors import InvalidRequestError
from shared.engine.spec_checks import expansion_widths
from shared.engine.types import SpecItem
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.packing import pack_f32, pack_i32, unpack_f32, unpack_i32


def pack_chain_items(items: Sequence[SpecItem]) -> draft_pb2.PackedChainItems | None:
    """The items as columns, or None when one carries features, one is a beam, or they mix shapes."""
    expansions = set()
    for item in items:
        if item.features is not None or ((item.tree_depth or item.tree_width) and not item.tree_expansion):
            return None
        if item.tree_expansion:
            expansions.add(tuple(item.tree_expansion))
    if len(expansions) > 1 or (expansions and any(i.chain_len for i in items)):
        return None
    expansion = next(iter(expansions), ())
    msg = draft_pb2.PackedChainItems(
        seq_ids=[i.seq_id for i in items],
        num_new_tokens=pack_i32([len(i.new_tokens) for i in items]),
        new_tokens=pack_i32([t for i in items for t in i.new_tokens]),
        chain_lengths=pack_i32([i.chain_len for i in items] if not expansion else [int(bool(i.tree_expansion)) for i in items]),
        tree_expansion=expansion,
    )
    if any(i.rollback for i in items):
        msg.rollbacks = pack_i32([i.rollback for i in items])
    if any(i.confidence_threshold for i in items):
        msg.confidence_thresholds = pack_f32([i.confidence_threshold for i in items])
    return msg


def unpack_chain_items(msg: draft_pb2.PackedChainItems) -> list[SpecItem]:
    """The SpecItems back; columns whose lengths disagree, or negative counts, are an InvalidRequestError."""
    n = len(msg.seq_ids)
    counts = unpack_i32(msg.num_new_tokens, "chains.num_new_tokens")
    tokens = unpack_i32(msg.new_tokens, "chains.new_tokens")
    lengths = unpack_i32(msg.chain_lengths, "chains.chain_lengths")
    rollbacks = unpack_i32(msg.rollbacks, "chains.rollbacks") if msg.rollbacks else [0] * n
    thresholds = unpack_f32(msg.confidence_thresholds, "chains.confidence_thresholds") if msg.confidence_thresholds else [0.0] * n
    if not (len(counts) == len(lengths) == len(rollbacks) == len(thresholds) == n):
        raise InvalidRequestError(f"packed chain items: {n} ids but {len(counts)} token counts, {len(lengths)} "
                                  f"chain lengths, {len(rollbacks)} rollbacks, {len(thresholds)} thresholds")  # fmt: skip
    if any(c < 0 for c in counts) or sum(counts) != len(tokens):
        raise InvalidRequestError(f"packed chain items: token counts {counts} do not cover {len(tokens)} tokens")
    if any(x < 0 for x in lengths) or any(x < 0 for x in rollbacks):
        raise InvalidRequestError("packed chain items: a negative chain length or rollback")
    ends = list(accumulate(counts))
    if msg.tree_expansion:
        expansion = tuple(msg.tree_expansion)
        depth, width = len(expansion), max(expansion_widths(expansion))
        return [SpecItem(seq_id, tokens[end - c : end], 0, depth, width, 0.0, expansion, rollback) if length else
                SpecItem(seq_id, tokens[end - c : end], rollback=rollback)  # positional: SpecItem's field order
                for seq_id, c, end, length, rollback in zip(msg.seq_ids, counts, ends, lengths, rollbacks)]  # fmt: skip
    return [SpecItem(seq_id, tokens[end - c : end], chain_len=length, confidence_threshold=threshold, rollback=rollback)
            for seq_id, c, end, length, rollback, threshold in zip(msg.seq_ids, counts, ends, lengths, rollbacks,
                                                                    thresholds)]  # fmt: skip
