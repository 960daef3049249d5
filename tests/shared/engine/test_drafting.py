"""Drafting primitives: chains with confidence stop, beam-search candidate trees."""

import math

import torch

from shared.engine.draft_engine import DraftEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem
from shared.engine.tree import depths

from conftest import Reference, make_runner


def test_chain_is_draft_greedy_with_its_probabilities(draft_model):
    ref = Reference(draft_model)
    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3])])
    tree = draft.speculate([SpecItem("a", [7], chain_len=5)])[0]
    assert tree.parent_ids == [-1, 0, 1, 2, 3]
    assert tree.token_ids == ref.greedy([1, 2, 3, 7], 5)
    seq = [1, 2, 3, 7]
    for token, prob in zip(tree.token_ids, tree.draft_probs):
        expect = torch.softmax(ref.logits(seq)[-1], -1)[token]
        assert math.isclose(prob, float(expect), rel_tol=1e-4)
        seq.append(token)
    assert len(draft.costs) == 5  # one batched forward per drafted token


def test_confidence_threshold_stops_chain(draft_model):
    """Algorithm 3: a chain drafts while its newest token's confidence is above T; the token at or below T is
    kept, and drafting stops after it."""
    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [4, 5])])
    full, stopped = draft.speculate(
        [SpecItem("a", [7], chain_len=6), SpecItem("b", [8], chain_len=6, confidence_threshold=1.0)]
    )
    assert len(full) == 6
    assert len(stopped) == 1  # a random model is never fully confident: its first token, then nothing
    probs = full.draft_probs
    draft.release(["a"])
    draft.prefill([PrefillItem("a", [1, 2, 3])])
    threshold = sorted(probs)[len(probs) // 2]
    cut = draft.speculate([SpecItem("a", [7], chain_len=6, confidence_threshold=threshold)])[0]
    expect = next((i + 1 for i, p in enumerate(probs) if p <= threshold), len(probs))
    assert len(cut) == expect and cut.token_ids == full.token_ids[:expect]


def test_beam_tree_shape_and_path_probabilities(draft_model):
    ref = Reference(draft_model)
    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3]), PrefillItem("b", [9, 9, 9, 9, 9])])
    tree_a, tree_b = draft.speculate(
        [SpecItem("a", [7], tree_depth=4, tree_width=3), SpecItem("b", [5], tree_depth=2, tree_width=2)]
    )
    assert len(tree_a) == 4 * 3 and len(tree_b) == 2 * 2
    assert depths(tree_a.parent_ids) == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert len(draft.costs) == 4  # one forward per depth for the whole batch
    # layer 0 = top-3 children of the root by draft probability
    root_probs = torch.softmax(ref.logits([1, 2, 3, 7])[-1], -1)
    assert tree_a.token_ids[:3] == root_probs.topk(3).indices.tolist()
    # each node's draft prob is its conditional probability given its path
    for j, (token, parent) in enumerate(zip(tree_a.token_ids, tree_a.parent_ids)):
        path = []
        node = parent
        while node >= 0:
            path.insert(0, tree_a.token_ids[node])
            node = tree_a.parent_ids[node]
        cond = torch.softmax(ref.logits([1, 2, 3, 7] + path)[-1], -1)[token]
        assert math.isclose(tree_a.draft_probs[j], float(cond), rel_tol=1e-4)
    # layer s keeps the w best path probabilities among all children of layer s-1
    path_prob = []
    for j, p in enumerate(tree_a.parent_ids):
        path_prob.append(tree_a.draft_probs[j] * (1.0 if p < 0 else path_prob[p]))
    for layer in range(1, 4):
        kept = path_prob[3 * layer : 3 * layer + 3]
        parents = range(3 * (layer - 1), 3 * layer)
        all_children = []
        for p in parents:
            path = []
            node = p
            while node >= 0:
                path.insert(0, tree_a.token_ids[node])
                node = tree_a.parent_ids[node]
            probs = torch.softmax(ref.logits([1, 2, 3, 7] + path)[-1], -1)
            all_children += (path_prob[p] * probs).tolist()
        best = sorted(all_children, reverse=True)[:3]
        assert all(math.isclose(a, b, rel_tol=1e-4) for a, b in zip(sorted(kept, reverse=True), best))


def test_sampling_chain_reports_the_distribution_it_sampled_from(draft_model):
    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3], SamplingParams(temperature=1.0, seed=3))])
    tree = draft.speculate([SpecItem("a", [7], chain_len=4)])[0]
    assert sorted(tree.child_dists) == [0, 1, 2, 3]
    for row, token in enumerate(tree.token_ids):
        dist = tree.child_dists[row]
        assert token in dist.token_ids.tolist()
        assert math.isclose(float(dist.probs.sum()), 1.0, rel_tol=1e-5)


def test_specinfer_expansion_expands_every_node(draft_model):
    """SpecInfer's <1,1,3,1,1,1,1,1>: the top expansion[d] children of every node at depth d, 1+1+3x6 = 20 nodes
    (a beam of width 3 keeps 3 nodes per level across the tree, so its branches can die); one forward per level."""
    from scheduler.policies.adaserve import SPECINFER_EXPANSION, SpecInferTree
    from scheduler.spec_shape import SpecContext

    ref = Reference(draft_model)
    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3])])
    policy = SpecInferTree()
    (shape,) = policy.decide([_auto()], SpecContext(0.0, 0, True))
    assert shape.expansion == SPECINFER_EXPANSION and shape.max_nodes == 20 and (shape.depth, shape.width) == (8, 3)
    tree = draft.speculate([shape.spec_item("a", [7])])[0]
    assert len(tree) == 20 and len(draft.costs) == 8
    level = depths(tree.parent_ids)
    assert [level.count(d) for d in range(8)] == [1, 1, 3, 3, 3, 3, 3, 3]
    children: dict[int, list[int]] = {}
    for j, parent in enumerate(tree.parent_ids):
        children.setdefault(parent, []).append(j)
    for parent, kids in children.items():
        path, node = [], parent
        while node >= 0:
            path.insert(0, tree.token_ids[node])
            node = tree.parent_ids[node]
        probs = torch.softmax(ref.logits([1, 2, 3, 7] + path)[-1], -1)
        k = SPECINFER_EXPANSION[0 if parent < 0 else level[parent] + 1]
        assert [tree.token_ids[c] for c in kids] == probs.topk(k).indices.tolist()  # distinct, most probable first
        for c in kids:
            assert math.isclose(tree.draft_probs[c], float(probs[tree.token_ids[c]]), rel_tol=1e-4)
    # the policy's cut of its own expansion keeps it whole
    (kept,) = policy.select([_auto()], [tree], SpecContext(0.0, 0, True))
    assert kept.token_ids == tree.token_ids and kept.parent_ids == tree.parent_ids


def _auto():
    from scheduler.request import Request

    return Request("a", [1, 2, 3], max_new_tokens=50)


def test_an_expansion_must_match_its_depth_and_width(draft_model):
    import pytest

    from shared.engine.errors import InvalidRequestError

    draft = DraftEngine(make_runner(draft_model))
    draft.prefill([PrefillItem("a", [1, 2, 3])])
    for bad in (SpecItem("a", [7], tree_depth=2, tree_width=3, tree_expansion=(1, 3, 1)),  # 3 levels, depth 2
                SpecItem("a", [7], tree_depth=2, tree_width=2, tree_expansion=(1, 3)),  # widest level 3
                SpecItem("a", [7], tree_depth=2, tree_width=1, tree_expansion=(1, 0))):  # fmt: skip
        with pytest.raises(InvalidRequestError):
            draft.speculate([bad])
