"""Deferring the draft's prefill while a learning policy mostly decides k = 0 (draft_admission.py)."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.policies.draft_admission import DraftAdmission
from scheduler.policies.faser import Faser
from scheduler.policies.nightjar import Nightjar, NightjarConfig
from scheduler.policies.speculation import FixedChain, SpecContext, SpecShape, plan_shapes
from scheduler.request import Request


def test_defers_once_most_recent_decisions_were_zero_and_lifts_when_they_are_not():
    assert DraftAdmission().threshold == 0.5
    a = DraftAdmission(window=4, threshold=0.7, min_decisions=6)
    assert a.wants_draft() and a.zero_share() is None  # too few decisions: prefill as usual
    a.record([0, 0, 0])
    a.record([0, 0, 1])
    assert a.zero_share() == pytest.approx(5 / 6) and not a.wants_draft()
    a.record([])  # a step without decisions changes nothing
    assert a.zero_share() == pytest.approx(5 / 6)
    for _ in range(4):  # the window moves on
        a.record([2, 0])
    assert a.zero_share() == pytest.approx(0.5) and a.wants_draft()
    with pytest.raises(ValueError):
        DraftAdmission(threshold=1.5)


def _decide_zero(policy, steps: int = 8) -> None:
    batch = [Request(f"r{i}", [1] * 8, max_new_tokens=32) for i in range(4)]
    for step in range(steps):
        policy.decide(batch, SpecContext(now=float(step), step=step, draft_available=True))


def test_nightjar_defers_the_draft_prefill_while_it_plays_zero():
    policy = Nightjar(NightjarConfig(max_k=2))
    assert policy.wants_draft(Request("new", [1]))
    # the real decide, with the bandit's batch-of-4 bucket pinned to γ = 0 (an exploiting bin, 0 far ahead)
    from scheduler.policies.nightjar import bucket

    policy.state.state["buckets"][str(bucket(4))] = {"n": [100, 1, 1], "g": [100.0, 1.0, 1.0], "tau": 2, "b": 1,
                                                     "j": 1, "H": 1, "explore": False}  # fmt: skip
    _decide_zero(policy)
    assert not policy.wants_draft(Request("new", [1]))


def test_faser_defers_the_draft_prefill_while_it_chooses_zero():
    policy = Faser()
    assert policy.wants_draft(Request("new", [1]))
    policy._admission.record([0] * 4)  # what decide records when eq. 2 picks s = 0 for everyone
    assert not policy.wants_draft(Request("new", [1]))


class DeferThenSpeculate(FixedChain):
    """Never prefills on the draft at admission, then speculates: the loop must prefill it on the draft first."""

    def wants_draft(self, req: Request) -> bool:
        return False


def test_a_deferred_request_is_prefilled_on_the_draft_when_it_first_speculates():
    from tests.scheduler.test_scheduler_loop import consume, make

    sched, target, draft, lm = make(DeferThenSpeculate(3))
    req = Request("r", [5, 6, 7, 8], max_new_tokens=12)

    async def main():
        task = asyncio.create_task(sched.run())
        tokens, _ = await consume(sched.submit(req))
        sched.stop()
        await task
        return tokens

    tokens = asyncio.run(main())
    assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens)  # lossless
    prefills = [args for m, args in draft.calls if m == "prefill"]
    assert prefills, "the request was never put on the draft"
    assert any(m == "speculate" for m, _ in draft.calls)


def test_smartspec_defers_before_its_own_rule_bars():
    """A lone request that stopped speculating: too few k = 0 decisions for §5's rule (70 % of the window),
    enough to defer (half of the last 16)."""
    from scheduler.policies.smartspec import SmartSpec
    from tests.scheduler.sim_reports import EXPENSIVE_VERIFY, requests, run_steps

    policy = SmartSpec()
    chosen = run_steps(policy, requests(1, prompt=50), [0.02], EXPENSIVE_VERIFY, steps=20)
    assert sum(ks == [0] for ks in chosen) > len(chosen) / 2  # it learned that little is accepted
    assert policy._zero_share() < policy.config.prefill_disable_threshold
    late = Request("late", [1] * 5)
    assert not policy.wants_draft(late) and "late" not in policy._no_draft  # deferred, not barred
