"""Relay lookahead, the target's side (the draft's: services/draft/relay_lookahead.py): which handoffs ask for a
lookahead, and whether the tokens a step committed take the last one.

A lookahead answers a handoff of shape S with a tree rooted at the draft's guess g of the bonus token, the
next tree (shape S) below it, drafted on the prefix ``base + [g]``, where ``base`` is the first-child path of
the tree the next step verifies. That step takes it when it commits exactly ``base + [g]``, keeps the shape S
and its handoff asks for a lookahead again; the draft decides the same from the same facts, and its answer
to that handoff says ``taken``.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.engine.spec_cap import item_depth, shape_key
from shared.engine.tree_cut import below_root, first_child_path, single_root
from shared.engine.types import LOOKAHEAD, SpecItem, TokenTree
from shared.miss_gate import MissGate
from shared.rpc.packing import unpack_trees

__all__ = ["LOOKAHEAD", "Ahead", "Check", "Handed", "Lookahead", "is_taken", "lookahead_gate", "unpack_lookaheads",
           "wants_lookahead"]  # fmt: skip


@dataclass
class Handed:
    """One sequence of a handoff."""

    item: SpecItem  # the tokens the draft lacks (this step's included) and the shape to draft next
    base: TokenTree | None  # the relayed tree this step verified, uncut (None: it verified none)
    lookahead: bool  # ask for a lookahead (wants_lookahead)


@dataclass
class Ahead:
    """Where a sequence's lookahead will come from: the handoff whose answer carries it, and its item there."""

    step: int
    index: int
    item: SpecItem


@dataclass
class Check:
    """A handoff that may take the lookahead of the sequence's last answer: decided when its next verify takes a
    tree (is_taken, on that answer), as the draft decides when it reads the handoff."""

    ahead: Ahead  # where that lookahead comes from (its answer's reference is held)
    item: SpecItem  # this handoff's item: the tokens the step committed, the shape
    base: TokenTree  # the relayed tree the step verified, uncut
    step: int  # this handoff: its answer says whether the draft took it
    index: int


@dataclass
class Lookahead:
    root: int  # the guessed bonus token
    tree: TokenTree  # the lookahead as drafted: the root, and the tree to verify next below it

    @property
    def below(self) -> TokenTree:
        """The tree to verify next, re-rooted under the root (made only for a lookahead taken)."""
        return below_root(self.tree)


def wants_lookahead(item: SpecItem, remaining: int) -> bool:
    """A chain or a fixed expansion (a beam's first level holds many nodes) with room for two more trees of this
    depth in the ``remaining`` tokens the sequence may emit after this step (else the shape shrinks: no use)."""
    return bool(item.chain_len or item.tree_expansion) and remaining >= 2 * (item_depth(item) + 1)


def is_taken(item: SpecItem, base: TokenTree | None, look: Lookahead | None, ahead: Ahead | None) -> bool:
    """The step committed exactly the lookahead's assumed prefix (the first-child path of ``base``, the tree it
    verified, and the guessed bonus token), and keeps the shape it was drafted for."""
    if look is None or base is None or ahead is None or shape_key(item) != shape_key(ahead.item):
        return False
    return item.new_tokens == [*(base.token_ids[i] for i in first_child_path(base)), look.root]


def unpack_lookaheads(reply) -> list[Lookahead | None]:
    """RelayTrees.lookaheads, one per item (None where the draft drafted none)."""
    trees = unpack_trees(reply.lookaheads, len(reply.lookaheads.has_probs))
    return [Lookahead(t.token_ids[0], t) if single_root(t) else None for t in trees]


def lookahead_gate() -> MissGate:
    """Lookaheads pause for a while where fewer than one in ten is taken (each miss cost the draft a call)."""
    return MissGate(window=64, max_miss=0.9, pause_steps=256)
