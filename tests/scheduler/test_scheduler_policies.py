"""Speculation, queue and selection policies on plain data."""

from __future__ import annotations

import pytest

from scheduler.policies.queue import FCFS, Capacity, QueuePolicy, reserved_tokens
from scheduler.policies.selection import PassThrough
from scheduler.policies.speculation import (
    FixedChain,
    NoSpeculation,
    SpecContext,
    SpecShape,
    SpeculationPolicy,
    plan_shapes,
    wants_draft,
)
from scheduler.request import Request, SpecMode, SpeculationSetting
from shared.engine.types import TokenTree

CTX = SpecContext(now=0.0, step=0, draft_available=True)


def req(rid="r", prompt=3, max_new=100, generated=0, mode=SpecMode.AUTO, k=0, priority=0, arrival=0.0):
    r = Request(rid, [1] * prompt, max_new_tokens=max_new, priority=priority, speculation=SpeculationSetting(mode, k))
    r.output_ids = [2] * generated
    r.arrival_time = arrival
    return r


# ----------------------------------------------------------------------------- SpecShape


def test_spec_shape_constructors_and_items():
    assert SpecShape.none() == SpecShape() and not SpecShape.none().speculates
    assert SpecShape.chain(0) == SpecShape.none() and SpecShape.tree(0, 3) == SpecShape.none()
    c = SpecShape.chain(4, confidence_threshold=0.3)
    assert c.speculates and c.max_depth == 4 and c.max_nodes == 4
    t = SpecShape.tree(3, 2)
    assert t.max_depth == 3 and t.max_nodes == 6
    item = c.spec_item("s", [7, 8])
    assert (item.seq_id, item.new_tokens, item.chain_len, item.confidence_threshold) == ("s", [7, 8], 4, 0.3)
    item = t.spec_item("s", [7])
    assert (item.chain_len, item.tree_depth, item.tree_width) == (0, 3, 2)
    with pytest.raises(ValueError):
        SpecShape.none().spec_item("s", [1])
    with pytest.raises(ValueError):
        SpecShape.chain(-1)


def test_spec_shape_capped():
    assert SpecShape.chain(5).capped(2) == SpecShape.chain(2)
    assert SpecShape.chain(5).capped(9) == SpecShape.chain(5)
    assert SpecShape.tree(4, 3).capped(1) == SpecShape.tree(1, 3)
    assert SpecShape.chain(5).capped(0) == SpecShape.none()


# ----------------------------------------------------------------------------- speculation policies


def test_no_speculation_and_fixed_chain():
    batch = [req("a"), req("b")]
    assert NoSpeculation().decide(batch, CTX) == [SpecShape.none()] * 2
    assert FixedChain(3).decide(batch, CTX) == [SpecShape.chain(3)] * 2
    assert not NoSpeculation().wants_draft(batch[0]) and FixedChain(3).wants_draft(batch[0])
    with pytest.raises(ValueError):
        FixedChain(0)


def test_plan_shapes_applies_modes_and_caps():
    batch = [
        req("auto"),
        req("off", mode=SpecMode.OFF),
        req("fixed", mode=SpecMode.FIXED, k=2),
        req("near_end", max_new=10, generated=7),  # 3 left: chain of at most 2 + bonus
        req("last", max_new=10, generated=9),  # 1 left: the bonus alone
    ]
    shapes = plan_shapes(FixedChain(4), batch, CTX)
    assert shapes == [SpecShape.chain(4), SpecShape.none(), SpecShape.chain(2), SpecShape.chain(2), SpecShape.none()]
    # FIXED overrides even NoSpeculation; OFF overrides everything
    assert plan_shapes(NoSpeculation(), batch, CTX)[:3] == [SpecShape.none(), SpecShape.none(), SpecShape.chain(2)]
    # draft unavailable: nobody speculates and the policy is not asked
    class Boom(SpeculationPolicy):
        def decide(self, batch, ctx):
            raise AssertionError("must not be called")

    down = SpecContext(now=0.0, step=0, draft_available=False)
    assert plan_shapes(Boom(), batch, down) == [SpecShape.none()] * 5


def test_plan_shapes_rejects_wrong_length():
    class Short(SpeculationPolicy):
        def decide(self, batch, ctx):
            return []

    with pytest.raises(ValueError, match="returned 0 shapes for 1"):
        plan_shapes(Short(), [req()], CTX)


def test_wants_draft():
    assert not wants_draft(FixedChain(2), req(mode=SpecMode.OFF))
    assert wants_draft(NoSpeculation(), req(mode=SpecMode.FIXED, k=3))
    assert wants_draft(FixedChain(2), req()) and not wants_draft(NoSpeculation(), req())


# ----------------------------------------------------------------------------- queue


def test_fcfs_strict_priority_then_arrival():
    w = [
        req("late0", priority=0, arrival=5),
        req("early1", priority=1, arrival=0),
        req("early0", priority=0, arrival=1),
        req("urgent", priority=-2, arrival=9),
        req("tie0", priority=0, arrival=1),
    ]
    assert [r.id for r in FCFS().order(w, now=10)] == ["urgent", "early0", "tie0", "late0", "early1"]
    assert [r.id for r in FCFS(use_priority=False).order(w, now=10)] == ["early1", "early0", "tie0", "late0", "urgent"]


def test_fcfs_schedule_respects_caps_without_skipping():
    running = [req("run", prompt=10, max_new=10)]  # reserves 20
    waiting = [req("a", prompt=5, max_new=5, arrival=0), req("big", prompt=50, max_new=50, arrival=1),
               req("small", prompt=1, max_new=1, arrival=2)]
    adm = FCFS().schedule(waiting, running, Capacity(max_batch_size=4, max_tokens_in_flight=60), now=0)
    # "big" does not fit; "small" behind it must wait (no overtaking the head of the queue)
    assert [r.id for r in adm.admit] == ["a"] and adm.preempt == []
    adm = FCFS().schedule(waiting, running, Capacity(max_batch_size=2, max_tokens_in_flight=10_000), now=0)
    assert [r.id for r in adm.admit] == ["a"]
    adm = FCFS().schedule(waiting, [], Capacity(max_batch_size=8, max_tokens_in_flight=10_000), now=0)
    assert [r.id for r in adm.admit] == ["a", "big", "small"]
    assert reserved_tokens(waiting[1]) == 100


def test_queue_policy_base_requires_order():
    with pytest.raises(NotImplementedError):
        QueuePolicy().schedule([req()], [], Capacity(1, 100), now=0)


def test_pass_through_selector():
    trees = [TokenTree.chain([1, 2]), TokenTree()]
    assert PassThrough().select([req("a"), req("b")], trees, CTX) is trees
