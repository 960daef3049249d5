"""Packed wire forms of the step streams: every tree, outcome and prompt round-trips; bad lengths are refused."""

from __future__ import annotations

import pytest

from shared.engine.errors import InvalidRequestError
from shared.engine.features import FeatureBlock
from shared.engine.types import AcceptResult, GrammarSpec, PrefillItem, SamplingParams, SparseDist, TokenTree
from shared.rpc.packing import (pack_accepts, pack_trees, stream_prefill_from_pb, stream_prefill_to_pb,
                                unpack_accepts, unpack_trees)  # fmt: skip

TREES = [
    TokenTree(),  # a plain decode step
    TokenTree([5, 6, 7, 8], [-1, 0, 1, 2], [0.875, 0.75, 0.5, 0.25]),  # float32-exact: the wire is float32
    TokenTree([1, 2, 3, 4, 5, 6], [-1, -1, 0, 0, 1, 2]),  # no draft probabilities
    TokenTree([9, 10], [-1, 0], [0.5, 0.5], {0: SparseDist([9, 11], [0.75, 0.25]), 2: SparseDist([3], [1.0])}),
]


def test_trees_round_trip_with_and_without_probabilities_and_child_distributions():
    back = unpack_trees(pack_trees(TREES), len(TREES), relay=True)
    for tree, got in zip(TREES, back):
        assert (got.token_ids, got.parent_ids, got.draft_probs) == (tree.token_ids, tree.parent_ids, tree.draft_probs)
        assert {r: (d.token_ids, d.probs) for r, d in got.child_dists.items()} == {
            r: (d.token_ids, d.probs) for r, d in tree.child_dists.items()}


def test_trees_without_distributions_after_one_with_them_keep_their_rows_apart():
    trees = [TREES[3], *TREES[:3], TokenTree([4], [-1], [], {0: None})]  # a None distribution: as none at all
    back = unpack_trees(pack_trees(trees), len(trees), relay=True)
    assert [sorted(t.child_dists) for t in back] == [[0, 2], [], [], [], []]
    assert [t.token_ids for t in back] == [t.token_ids for t in trees]


def test_the_engines_side_gets_tensors():
    (tree,) = unpack_trees(pack_trees(TREES[3:]), 1)
    assert tree.child_dists[0].token_ids.tolist() == [9, 11] and tree.child_dists[0].probs.tolist() == [0.75, 0.25]


def test_numbers_travel_as_raw_little_endian_bytes():
    msg = pack_trees([TokenTree([1, 258], [-1, 0])])
    assert msg.token_ids == bytes([1, 0, 0, 0, 2, 1, 0, 0]) and msg.parent_ids == b"\xff\xff\xff\xff\x00\x00\x00\x00"


@pytest.mark.parametrize("field, value", [("num_nodes", b"\x01\x00\x00"), ("token_ids", b""), ("has_probs", b"\x01\x01")])
def test_packed_trees_that_disagree_are_refused(field, value):
    msg = pack_trees([TokenTree([4], [-1], [0.5])])
    setattr(msg, field, value)
    with pytest.raises(InvalidRequestError):
        unpack_trees(msg, 1)


def test_accepts_round_trip_split_by_the_trees():
    results = [AcceptResult([], [3], []), AcceptResult([0, 1], [5, 6, 4], [1, 1, 0, -1], [3]),
               AcceptResult([0], [1, 2], [1, 0, 0, -1, -1, -1])]  # fmt: skip
    back = unpack_accepts(pack_accepts(results), [0, 4, 6])
    assert [(r.accepted_nodes, r.tokens, r.node_status, r.pruned_nodes) for r in back] == [
        (r.accepted_nodes, r.tokens, r.node_status, r.pruned_nodes) for r in results]
    with pytest.raises(InvalidRequestError):
        unpack_accepts(pack_accepts(results), [0, 4, 5])


def test_a_prefill_round_trips_with_pushed_features():
    block = FeatureBlock(0, 3, 2, "float16", b"\x01\x02\x03\x04", pushed=True)  # one row inline, two pushed
    msg = stream_prefill_to_pb(PrefillItem("s", [1, 2, 3], SamplingParams(0.7, 0.9, 5), features=block))
    msg.features_pushed = True
    item = stream_prefill_from_pb(msg)
    assert (item.seq_id, item.prompt_ids, item.sampling) == ("s", [1, 2, 3], SamplingParams(0.7, 0.9, 5))
    assert item.features == block and item.features.inline_rows == 1


def test_a_prefill_carries_its_grammar_and_chunking_on_the_stream():
    grammar = GrammarSpec("json_schema", '{"type": "object"}', start=3)
    item = PrefillItem("g", [1, 2, 3], max_tokens=2, cache_salt="t", num_prompt_tokens=3, grammar=grammar)
    back = stream_prefill_from_pb(stream_prefill_to_pb(item))
    assert (back.grammar, back.max_tokens, back.cache_salt, back.num_prompt_tokens) == (grammar, 2, "t", 3)
    assert stream_prefill_from_pb(stream_prefill_to_pb(PrefillItem("f", [1]))).grammar is None


def test_pushed_blocks_join_and_slice_by_position_keeping_inline_rows_a_prefix():
    real = FeatureBlock(0, 2, 2, "float16", b"abcdefgh")
    pushed = FeatureBlock(1, 3, 2, "float16", b"", pushed=True)
    joined = FeatureBlock.join([real, pushed])
    assert (joined.start, joined.num_rows, joined.data, joined.pushed) == (0, 4, b"abcd", True)
    assert joined.rows(1, 4) == FeatureBlock(1, 3, 2, "float16", b"", pushed=True)
    assert FeatureBlock.join([joined, FeatureBlock(4, 1, 2, "float16", b"", pushed=True)]).num_rows == 5
