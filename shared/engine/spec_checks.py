"""Checks every draft (model or n-gram) applies to a prefill or speculate call before touching any sequence."""

from __future__ import annotations

from shared.engine.errors import DuplicateSequenceError, InvalidRequestError
from shared.engine.types import PrefillItem, SpecItem


def check_distinct(items: list[SpecItem]) -> None:
    ids = [it.seq_id for it in items]
    if len(ids) != len(set(ids)):
        raise InvalidRequestError("a sequence appears twice in one speculate call")


def check_shape(it: SpecItem, *, max_chain: int, max_depth: int, max_width: int) -> None:
    """One shape (chain or tree) within the draft's limits, and a confidence threshold in [0, 1]."""
    if it.chain_len and (it.tree_depth or it.tree_width):
        raise InvalidRequestError(f"sequence {it.seq_id!r}: ask for a chain or a tree, not both")
    if not (0 <= it.chain_len <= max_chain):
        raise InvalidRequestError(f"sequence {it.seq_id!r}: chain length must be in [0, {max_chain}]")
    if not (0 <= it.tree_depth <= max_depth and 0 <= it.tree_width <= max_width):
        raise InvalidRequestError(
            f"sequence {it.seq_id!r}: tree depth must be in [0, {max_depth}] and width in [0, {max_width}]"
        )
    if not (0.0 <= it.confidence_threshold <= 1.0):
        raise InvalidRequestError(f"sequence {it.seq_id!r}: confidence threshold must be in [0, 1]")
    if it.tree_expansion:
        if len(it.tree_expansion) != it.tree_depth or min(it.tree_expansion) < 1:
            raise InvalidRequestError(
                f"sequence {it.seq_id!r}: an expansion needs one entry >= 1 per tree level ({it.tree_depth})"
            )
        if max(expansion_widths(it.tree_expansion)) != it.tree_width:
            raise InvalidRequestError(
                f"sequence {it.seq_id!r}: an expansion's width is the most nodes one level holds "
                f"({max(expansion_widths(it.tree_expansion))}), got {it.tree_width}"
            )


def expansion_widths(expansion: tuple[int, ...] | list[int]) -> list[int]:
    """Nodes per level of a per-node expansion: the running product (<1,1,3,1> -> 1, 1, 3, 3)."""
    widths, n = [], 1
    for k in expansion:
        n *= k
        widths.append(n)
    return widths


def check_prefill_item(runner, p: PrefillItem) -> None:
    """A new, non-empty sequence of in-vocabulary tokens (``runner``: a ModelRunner or the n-gram TokenStore)."""
    if p.seq_id in runner.seqs:
        raise DuplicateSequenceError(f"sequence {p.seq_id!r} is already live")
    if not p.prompt_ids:
        raise InvalidRequestError(f"sequence {p.seq_id!r}: empty prompt")
    runner.check_tokens(p.prompt_ids, what=f"sequence {p.seq_id!r}")


def check_distinct_prefill(items: list[PrefillItem]) -> None:
    ids = [p.seq_id for p in items]
    if len(ids) != len(set(ids)):
        raise InvalidRequestError("a sequence appears twice in one prefill")
