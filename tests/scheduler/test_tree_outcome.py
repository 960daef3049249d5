"""tree_ok and record_acceptance: the chain fast path agrees with the general per-node walk."""

from __future__ import annotations

import pytest

from scheduler.request import Request
from scheduler.tree_outcome import is_chain, record_acceptance, tree_ok
from shared.engine.types import AcceptResult, TokenTree


def test_is_chain():
    assert is_chain([-1, 0, 1, 2]) and is_chain([-1]) and is_chain([])
    assert not is_chain([-1, 0, 0]) and not is_chain([-1, -1]) and not is_chain([0, 1])
    assert not is_chain((-1, 0, 1))  # only lists take the fast path
    assert is_chain(list(range(-1, 999)))  # long chains too (not cached)


@pytest.mark.parametrize(
    "parents, ok",
    [([-1, 0, 1], True), ([-1, 0, 0, 1], True), ([-1, -1, 1], True), ([-1, 1, 0], False), ([0], False), ([-2], False)],
)
def test_tree_ok(parents, ok):
    assert tree_ok(TokenTree(list(range(len(parents))), parents)) is ok
    assert not tree_ok(TokenTree([1, 2], [-1]))  # a parent per node
    assert not tree_ok(TokenTree([1, 2], [-1, 0], [0.5]))  # a probability per node, if any


def _walk(tree: TokenTree, num_accepted: int) -> tuple[list[int], list[int], int]:
    depth: list[int] = []
    for p in tree.parent_ids:
        depth.append(0 if p == -1 else depth[p] + 1)
    max_depth = max(depth) + 1
    return [1] * max_depth, [1] * num_accepted + [0] * (max_depth - num_accepted), max_depth


@pytest.mark.parametrize("parents, accepted", [([-1, 0, 1, 2], [0, 1]), ([-1, -1, 0, 0, 1, 1], [1, 4]), ([-1], [])])
def test_record_acceptance_counts_per_depth(parents, accepted):
    tree = TokenTree(list(range(len(parents))), parents)
    req = Request(id="a", prompt_ids=[1], max_new_tokens=10)
    res = AcceptResult(accepted, [7] * (len(accepted) + 1), [0] * len(parents))
    record_acceptance(req, tree, res)
    drafted, acc, max_depth = _walk(tree, len(accepted))
    assert req.position_drafted == drafted and req.position_accepted == acc
    assert req.drafted_depths == [max_depth] and req.accepted_lens == [len(accepted)]
    assert req.num_drafted_tokens == len(parents) and req.num_accepted_tokens == len(accepted)
    record_acceptance(req, TokenTree([1], [-1]), AcceptResult([], [7], [0]))  # a shallower tree: counts kept
    assert req.position_drafted[0] == 2 and len(req.position_drafted) == max_depth
