"""A step plan's draft relay on the target (draft_relay.py): the relayed trees in, the handoff out.

Before the step: a release waits for its sequence's answer (so nothing of it is still on its way to the
draft once the outcome is out), and each verify flagged in ``relay_flags`` takes the tree the draft
relayed for it (1) or drops it for a plain decode step (2); a tree that never came is a miss.
After the step: the sequences of ``relay`` that were verified hand the draft the tokens it lacks
(``pending_tokens``, then this step's accepted tokens and bonus token) with their next shape, capped to
what the sequence may still emit (shared/engine/spec_cap.py); a sequence with nothing left is not handed off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.target.relay_lookahead import Handed, wants_lookahead
from shared.engine.errors import InvalidRequestError
from shared.engine.spec_cap import capped_item, cut_chain
from shared.engine.types import RELAY_DROP, RELAY_TAKE, AcceptResult, SpecItem, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import target_pb2
from shared.rpc.chain_packing import unpack_chain_items
from shared.rpc.packing import unpack_i32


@dataclass
class Taken:
    """What a plan took from the relay."""

    trees: list[TokenTree] = field(default_factory=list)  # the relayed trees verified, in plan order
    missed: list[str] = field(default_factory=list)  # the ids whose tree never came
    bases: dict[str, TokenTree] = field(default_factory=dict)  # seq id -> its whole relayed tree (a lookahead's base)
    lookaheads: int = 0  # trees that were lookaheads (no wait for the draft)


async def take_relayed(relay, plan: target_pb2.TargetPlan, verifies: list[VerifyItem]) -> Taken:
    """Put the relayed trees into ``verifies``."""
    if plan.releases:
        await relay.settle(plan.releases)
    flags = plan.relay_flags
    if not flags:
        return Taken()
    if len(flags) != len(verifies):
        raise InvalidRequestError(f"relay_flags: {len(flags)} flags for {len(verifies)} verifies")
    flagged = [(item, flag) for item, flag in zip(verifies, flags) if flag]
    if any(flag not in (RELAY_TAKE, RELAY_DROP) for _, flag in flagged):
        raise InvalidRequestError("relay_flags: each flag is 0, 1 (take the relayed tree) or 2 (drop it)")
    if any(len(item.tree) for item, _ in flagged):
        raise InvalidRequestError("a verify flagged relayed carries a tree of its own")
    cuts = unpack_i32(plan.relay_max_nodes, "relay_max_nodes") if plan.relay_max_nodes else [0] * len(verifies)
    if len(cuts) != len(verifies):
        raise InvalidRequestError(f"relay_max_nodes: {len(cuts)} lengths for {len(verifies)} verifies")
    cut = {item.seq_id: n for item, n in zip(verifies, cuts) if n}
    got, looked = await relay.take([item.seq_id for item, _ in flagged])
    out = Taken(lookaheads=looked)
    for (item, flag), tree in zip(flagged, got):
        if tree is None:
            out.missed.append(item.seq_id)
        elif flag == RELAY_TAKE:
            item.tree = cut_chain(tree, cut.get(item.seq_id, 0))
            out.trees.append(item.tree)
            out.bases[item.seq_id] = tree  # uncut: a lookahead assumes its whole first-child path
    return out


def hand_off(relay, plan: target_pb2.TargetPlan, handoffs: list[tuple[SpecItem, int]], results: list[AcceptResult],
             bases: dict[str, TokenTree]) -> list[str]:  # fmt: skip
    """Hand the draft this step's tokens of the relayed sequences (``relay_items``); the ids handed off. ``bases``:
    the relayed trees this step verified (a lookahead assumes their first-child paths)."""
    by_id = dict(zip(plan.verify_ids, results))
    items, tokens = [], 0
    for item, remaining in handoffs:
        res = by_id.get(item.seq_id)
        if res is None or not res.tokens:
            continue  # not verified in this plan: nothing to hand off
        item.new_tokens += res.tokens
        tokens += len(res.tokens)
        left = remaining - len(res.tokens) - 1
        item = capped_item(item, left)
        if item is not None:
            items.append(Handed(item, bases.get(item.seq_id), wants_lookahead(item, left)))
    return relay.handoff(plan.relay.draft, items, dict(plan.trace_context), tokens) if items else []


def relay_items(msg: target_pb2.RelayPlan) -> list[tuple[SpecItem, int]]:
    """The plan's handoffs: each sequence's next speculation (its pending tokens) and what it may still emit.
    Read before the step runs: a malformed one is the step's InvalidRequestError, with nothing committed."""
    if msg.HasField("chains"):
        items = unpack_chain_items(msg.chains)
        remaining = unpack_i32(msg.remaining, "relay remaining")
        if len(remaining) != len(items):
            raise InvalidRequestError(f"relay: {len(remaining)} remaining counts for {len(items)} chains")
        return list(zip(items, remaining))
    return [(item, m.remaining) for m in msg.items if (item := relay_item_from_pb(m)) is not None]


def relay_item_from_pb(msg: target_pb2.RelayItem) -> SpecItem | None:
    """The draft's next speculation of one relayed sequence (its pending tokens), in its shape."""
    new_tokens = unpack_i32(msg.pending_tokens, f"sequence {msg.seq_id!r} pending_tokens")
    shape = msg.WhichOneof("shape")
    if shape == "chain":
        return SpecItem(msg.seq_id, new_tokens, chain_len=msg.chain.length, confidence_threshold=msg.chain.confidence_threshold)
    if shape == "tree":
        return SpecItem(msg.seq_id, new_tokens, tree_depth=msg.tree.depth, tree_width=msg.tree.width,
                        tree_expansion=tuple(msg.tree.expansion))  # fmt: skip
    return None
