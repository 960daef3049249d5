"""Relay lookahead's bookkeeping on both sides, without services: the draft's optimistic state
(services/draft/relay_lookahead.py) and the target's take rule (services/target/relay_lookahead.py)."""

from __future__ import annotations

import pytest

from services.draft.relay_lookahead import LOOKAHEAD, Lookaheads, _LookaheadFailed, lookahead_shape
from services.target.relay_lookahead import Ahead, Lookahead, is_taken, wants_lookahead
from shared.engine.tree_cut import below_root, first_child_path, single_root
from shared.engine.types import SpecItem, TokenTree


class Draft:
    """A fake engine: records each speculate call; a chain of n drafts tokens next, next + 1, ..."""

    def __init__(self) -> None:
        self.calls: list[list[SpecItem]] = []
        self.next = 100
        self.fail_on: int | None = None

    def __call__(self, items: list[SpecItem]) -> list[TokenTree]:
        self.calls.append([SpecItem(i.seq_id, list(i.new_tokens), i.chain_len, rollback=i.rollback,
                                    tree_depth=i.tree_depth, tree_expansion=i.tree_expansion) for i in items])  # fmt: skip
        if self.fail_on == len(self.calls):
            raise RuntimeError("engine down")
        out = []
        for i in items:
            n = i.chain_len
            out.append(TokenTree.chain(list(range(self.next, self.next + n))))
            self.next += n
        return out


def test_a_fresh_tree_comes_with_a_lookahead_on_its_whole_path():
    draft, look = Draft(), Lookaheads()
    fresh, looks, bad, taken = look.run(draft, [SpecItem("a", [7], chain_len=3)], bytes([LOOKAHEAD]))
    assert fresh[0].token_ids == [100, 101, 102] and not bad and not taken
    # the second call commits the fresh chain optimistically and drafts one more level: the guessed bonus first
    assert draft.calls[1][0].new_tokens == [100, 101, 102] and draft.calls[1][0].chain_len == 4
    assert looks[0].token_ids == [103, 104, 105, 106]
    st = look.states["a"]
    assert (st.path, st.guess, st.next_path) == ([100, 101, 102], 103, [104, 105, 106])


def test_taking_it_is_one_call_and_anything_else_rolls_the_optimistic_path_back():
    draft, look = Draft(), Lookaheads()
    look.run(draft, [SpecItem("a", [7], chain_len=3)], bytes([LOOKAHEAD]))
    # the target committed the whole chain and the guessed bonus: it verifies 104-106 next, without waiting, and
    # the draft, seeing the same, takes it
    fresh, looks, bad, taken = look.run(draft, [SpecItem("a", [100, 101, 102, 103], chain_len=3)], bytes([LOOKAHEAD]))
    assert len(draft.calls) == 3 and not bad and taken == {0} and len(fresh[0]) == 0
    assert draft.calls[2][0].new_tokens == [103, 104, 105, 106] and draft.calls[2][0].rollback == 0
    assert looks[0].token_ids[0] == 107 and look.num_taken == 1
    # two accepted and another bonus: not taken, so the optimistic 104-106 go back before the true tokens
    fresh, looks, bad, taken = look.run(draft, [SpecItem("a", [104, 105, 9], chain_len=3)], bytes([LOOKAHEAD]))
    assert draft.calls[3][0].rollback == 3 and draft.calls[3][0].new_tokens == [104, 105, 9] and not taken
    assert len(fresh[0]) == 3 and len(looks[0]) == 4


def test_a_take_needs_the_assumed_prefix_the_same_shape_and_a_lookahead_asked_for_again():
    draft, look = Draft(), Lookaheads()
    look.run(draft, [SpecItem("a", [7], chain_len=3), SpecItem("b", [7], chain_len=3)], bytes([LOOKAHEAD] * 2))
    items = [SpecItem("a", [1, 2, 3, 4], chain_len=3), SpecItem("b", [7], chain_len=3)]
    fresh, looks, bad, taken = look.run(draft, items, bytes([LOOKAHEAD, LOOKAHEAD]))
    assert not taken and not bad and all(len(t) == 3 for t in fresh)  # other tokens: rolled back, drafted afresh
    assert [c.rollback for c in draft.calls[-2]] == [3, 3]
    # another shape than the lookahead was drafted for: not a take either
    look.run(draft, [SpecItem("c", [7], chain_len=2)], bytes([LOOKAHEAD]))
    st = look.states["c"]
    _, _, _, taken = look.run(draft, [SpecItem("c", [*st.path, st.guess], chain_len=3)], bytes([LOOKAHEAD]))
    assert not taken and draft.calls[-2][0].rollback == len(st.path)
    # nor the assumed prefix with no lookahead asked for (the target does not take it then)
    look.run(draft, [SpecItem("d", [7], chain_len=2)], bytes([LOOKAHEAD]))
    st = look.states["d"]
    _, _, _, taken = look.run(draft, [SpecItem("d", [*st.path, st.guess], chain_len=2)], b"")
    assert not taken and draft.calls[-1][0].rollback == len(st.path) and "d" not in look.states


def test_the_schedulers_own_calls_roll_back_and_releases_forget():
    draft, look = Draft(), Lookaheads()
    look.run(draft, [SpecItem("a", [7], chain_len=3), SpecItem("b", [7], chain_len=3)], bytes([LOOKAHEAD] * 2))
    item = SpecItem("a", [5], chain_len=2)
    look.claim([item])
    assert item.rollback == 3 and "a" not in look.states
    look.forget(["b"])
    assert not look.states


def test_no_lookahead_for_a_beam_or_past_the_drafts_limits():
    assert lookahead_shape(SpecItem("a", tree_depth=2, tree_width=2), {}) is None
    assert lookahead_shape(SpecItem("a", chain_len=4), {"max_chain": 4}) is None
    shape = lookahead_shape(SpecItem("a", tree_depth=2, tree_width=4, tree_expansion=(2, 2)), {"max_depth": 8})
    assert shape.tree_expansion == (1, 2, 2) and shape.tree_depth == 3 and shape.tree_width == 4
    draft, look = Draft(), Lookaheads({"max_chain": 3})
    fresh, looks, bad, _ = look.run(draft, [SpecItem("a", [7], chain_len=3)], bytes([LOOKAHEAD]))
    assert len(draft.calls) == 1 and len(fresh[0]) == 3 and not len(looks[0]) and not look.states


def test_a_failed_lookahead_call_keeps_the_fresh_trees():
    draft, look = Draft(), Lookaheads()
    look.run(draft, [SpecItem("a", [7], chain_len=2)], bytes([LOOKAHEAD]))
    st = look.states["a"]
    draft.fail_on = 4  # call 3: b's fresh tree; call 4: both lookaheads
    items = [SpecItem("a", [*st.path, st.guess], chain_len=2), SpecItem("b", [7], chain_len=2)]
    with pytest.raises(_LookaheadFailed) as failed:
        look.run(draft, items, bytes([LOOKAHEAD, LOOKAHEAD]))
    fresh, looks, bad, taken = failed.value.answer
    assert len(fresh[1]) == 2 and bad == {0} and not taken and not look.states


def test_the_target_takes_only_the_exact_prefix_in_the_same_shape():
    item = SpecItem("a", [1, 2, 3, 9], chain_len=3)
    look, ahead = Lookahead(9, TokenTree.chain([9, 4, 5, 6])), Ahead(1, 0, SpecItem("a", chain_len=3))
    base = TokenTree.chain([1, 2, 3])
    assert is_taken(item, base, look, ahead) and look.below.token_ids == [4, 5, 6]
    assert not is_taken(item, TokenTree.chain([1, 2, 4]), look, ahead)  # a rejection
    assert not is_taken(SpecItem("a", [1, 2, 3, 8], chain_len=3), base, look, ahead)  # another bonus
    assert not is_taken(SpecItem("a", [1, 2, 3, 9], chain_len=2), base, look, ahead)  # the shape changed
    tree = TokenTree([1, 7, 2, 8], [-1, -1, 0, 0])  # 1 -> 2 is the first-child path of a 2-2 tree
    assert is_taken(SpecItem("a", [1, 2, 9], chain_len=3), tree, look, ahead)
    assert not is_taken(item, None, look, ahead)  # this step verified no relayed tree
    assert wants_lookahead(SpecItem("a", chain_len=3), 8) and not wants_lookahead(SpecItem("a", chain_len=3), 7)
    assert not wants_lookahead(SpecItem("a", tree_depth=2, tree_width=2), 100)  # a beam


def test_tree_paths_and_rerooting():
    # root 0 -> (1, 2); 1 -> (3, 4); 2 -> 5
    tree = TokenTree([10, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 1, 2], [0.9, 0.5, 0.4, 0.3, 0.2, 0.1])
    tree.child_dists = {0: "root", 1: "under-10", 2: "under-11"}
    assert first_child_path(tree) == [0, 1, 3] and single_root(tree)
    below = below_root(tree)
    assert below.token_ids == [11, 12, 13, 14, 15] and below.parent_ids == [-1, -1, 0, 0, 1]
    assert below.draft_probs == [0.5, 0.4, 0.3, 0.2, 0.1]
    assert below.child_dists == {0: "under-10", 1: "under-11"}  # the rows move up with their nodes
    assert not single_root(below) and first_child_path(below) == [0, 2]
    assert first_child_path(TokenTree()) == []
