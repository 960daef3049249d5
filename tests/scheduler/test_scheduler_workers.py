"""Clocks and the toy fake workers."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM, greedy_accept
from scheduler.workers import DraftWorker, FakeClock, RealClock, TargetWorker
from shared.engine.errors import DuplicateSequenceError, UnknownSequenceError
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem


def test_fake_clock_auto_advance_overlaps_concurrent_sleeps():
    clock = FakeClock(start=10.0)
    order = []

    async def sleeper(name, s):
        await asyncio.sleep(0)  # register a turn late: still overlaps
        await clock.sleep(s)
        order.append((name, clock.now()))

    async def main():
        await asyncio.gather(sleeper("a", 1.0), sleeper("b", 2.0), sleeper("c", 0.5))
        await clock.sleep(0.25)

    asyncio.run(main())
    assert order == [("c", 10.5), ("a", 11.0), ("b", 12.0)]
    assert clock.now() == pytest.approx(12.25)


def test_fake_clock_manual_advance():
    clock = FakeClock(auto_advance=False)
    woke = []

    async def main():
        async def sleeper():
            await clock.sleep(1.0)
            woke.append(clock.now())

        task = asyncio.create_task(sleeper())
        for _ in range(5):
            await asyncio.sleep(0)
        assert woke == []
        clock.advance(0.5)
        await asyncio.sleep(0)
        assert woke == []
        clock.advance(0.5)
        await task
        with pytest.raises(ValueError):
            clock.advance(-1)

    asyncio.run(main())
    assert woke == [1.0]


def test_real_clock_is_monotonic():
    c = RealClock()
    a = c.now()
    asyncio.run(c.sleep(0))
    assert c.now() >= a


def test_fakes_satisfy_protocols():
    lm = ToyLM()
    assert isinstance(FakeTarget(lm), TargetWorker)
    assert isinstance(FakeDraft(ToyDraftLM(lm)), DraftWorker)


def test_toy_lm_is_deterministic_and_draft_agreement_tunable():
    lm = ToyLM(vocab_size=50, seed=1)
    assert lm.generate([1, 2, 3], 30) == ToyLM(vocab_size=50, seed=1).generate([1, 2, 3], 30)
    assert lm.generate([1, 2, 3], 30) != ToyLM(vocab_size=50, seed=2).generate([1, 2, 3], 30)
    seq = lm.generate([4, 5], 400)
    prefixes = [[4, 5] + seq[:i] for i in range(len(seq))]
    for p, lo, hi in [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (0.6, 0.5, 0.7)]:
        d = ToyDraftLM(lm, agree_prob=p)
        rate = sum(d.next_token(x)[0] == lm.next_token(x) for x in prefixes) / len(prefixes)
        assert lo <= rate <= hi


def test_greedy_accept_chain_and_tree():
    lm = ToyLM(seed=4)
    ctx = [3, 1, 4]
    truth = lm.generate(ctx, 4)
    # all accepted: bonus is the 4th token
    res = greedy_accept(lm, ctx, TokenTree.chain(truth[:3]))
    assert res.accepted_nodes == [0, 1, 2] and res.tokens == truth and res.node_status == [1, 1, 1]
    # second wrong: accept one, bonus = the correct second token, third never reached
    wrong = (truth[1] + 1) % 50
    res = greedy_accept(lm, ctx, TokenTree.chain([truth[0], wrong, truth[2]]))
    assert res.accepted_nodes == [0] and res.tokens == truth[:2] and res.node_status == [1, 0, -1]
    # tree: root has a wrong and a right child; the right one's child is right too
    tree = TokenTree(token_ids=[wrong, truth[0], truth[1]], parent_ids=[-1, -1, 1])
    res = greedy_accept(lm, ctx, tree)
    assert res.accepted_nodes == [1, 2] and res.tokens == truth[:3] and res.node_status == [0, 1, 1]
    # empty tree: plain decode
    res = greedy_accept(lm, ctx, TokenTree())
    assert res.tokens == truth[:1] and res.num_accepted == 0


def test_fake_workers_contract():
    lm = ToyLM()

    async def main():
        t = FakeTarget(lm)
        d = FakeDraft(ToyDraftLM(lm, 1.0), reference=t)
        (res,) = await t.prefill([PrefillItem("s", [1, 2])])
        await d.prefill([PrefillItem("s", [1, 2])])
        with pytest.raises(DuplicateSequenceError):
            await t.prefill([PrefillItem("s", [1])])
        (tree,) = await d.speculate([SpecItem("s", [res.first_token], chain_len=3)])
        assert len(tree) == 3 and tree.parent_ids == [-1, 0, 1]
        (acc,) = await t.verify([VerifyItem("s", tree)])
        assert acc.num_accepted == 3  # agree_prob 1.0
        (tree,) = await d.speculate([SpecItem("s", acc.tokens, tree_depth=2, tree_width=3)])
        assert len(tree) == 6 and tree.parent_ids == [-1, -1, -1, 0, 0, 0]
        assert d.mismatches == []
        await t.release(["s", "never-held"])  # idempotent
        with pytest.raises(UnknownSequenceError):
            await t.verify([VerifyItem("s")])
        d.crash()
        with pytest.raises(ConnectionError):
            await d.speculate([SpecItem("s", [1], chain_len=1)])
        d.down = False
        assert d.seqs == {}

    asyncio.run(main())
