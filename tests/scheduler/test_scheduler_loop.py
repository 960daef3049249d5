"""The iteration loop against the toy fake workers: lossless output, streaming, degradation, stops, aborts."""

from __future__ import annotations

import asyncio
import random

import pytest

from scheduler.engine_loop import RequestStream, Scheduler, SchedulerConfig, TokenEvent
from scheduler.policies.queue import FCFS, Admission
from scheduler.policies.speculation import FixedChain, NoSpeculation, SpecShape, SpeculationPolicy
from scheduler.report import StepReport
from scheduler.target_link import TargetRecoveryConfig
from scheduler.request import FinishReason, Request, RequestState, SpecMode, SpeculationSetting
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM, toy_detokenize
from scheduler.workers import FakeClock, NullObserver
from shared.engine.types import TokenTree

POLICIES = [NoSpeculation(), FixedChain(1), FixedChain(3), FixedChain(5)]


def make(policy=None, *, agree=0.7, clock=None, draft=True, observers=(), queue_policy=None, target_kw=None, **cfg):
    lm = ToyLM(vocab_size=50, seed=3)
    clock = clock or FakeClock()
    target = FakeTarget(lm, clock, **(target_kw or {}))
    fake_draft = FakeDraft(ToyDraftLM(lm, agree, seed=5), clock, reference=target) if draft else None
    sched = Scheduler(
        target,
        fake_draft,
        config=SchedulerConfig(**cfg),
        clock=clock,
        spec_policy=policy or NoSpeculation(),
        queue_policy=queue_policy,
        detokenize=toy_detokenize,
        observers=observers,
    )
    return sched, target, fake_draft, lm


def mixed_requests(n=8, seed=0, **kw) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(
            id=f"r{i}",
            prompt_ids=[rng.randrange(50) for _ in range(rng.randint(1, 24))],
            max_new_tokens=rng.randint(1, 40),
            **kw,
        )
        for i in range(n)
    ]


async def consume(stream: RequestStream) -> tuple[list[int], list[TokenEvent]]:
    events = [ev async for ev in stream]
    return [t for ev in events for t in ev.token_ids], events


def check_stream(events: list[TokenEvent], expected: list[int]) -> None:
    """Each token exactly once, in order, indices contiguous, exactly one (final) finished event."""
    index = 0
    for ev in events:
        assert ev.index == index
        index += len(ev.token_ids)
    assert [t for ev in events for t in ev.token_ids] == expected
    assert [ev.finished for ev in events] == [False] * (len(events) - 1) + [True]


async def run_all(sched: Scheduler, reqs: list[Request]):
    streams = [sched.submit(r) for r in reqs]
    _, *outs = await asyncio.gather(sched.run_until_idle(), *(consume(s) for s in streams))
    return outs


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.reports: list[StepReport] = []
        self.finished: list[str] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)

    def on_finish(self, request: Request) -> None:
        self.finished.append(request.id)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{p.name}{getattr(p, 'shape', SpecShape()).k or ''}")
def test_lossless_mixed_batch(policy):
    rec = Recorder()
    sched, target, draft, lm = make(policy, observers=[rec])
    reqs = mixed_requests(10)
    outs = asyncio.run(run_all(sched, reqs))
    for req, (tokens, events) in zip(reqs, outs):
        expected = lm.generate(req.prompt_ids, req.max_new_tokens)
        assert tokens == expected == req.output_ids
        check_stream(events, expected)
        assert req.state is RequestState.FINISHED and req.finish_reason is FinishReason.LENGTH
        assert len(req.token_times) == len(req.output_ids)
    assert draft.mismatches == []
    assert sorted(rec.finished) == sorted(r.id for r in reqs)
    # one batched verify per step, at most one speculate per step
    assert sum(1 for m, _ in target.calls if m == "verify") == sum(1 for r in rec.reports if r.batch_size)
    assert sum(1 for m, _ in draft.calls if m == "speculate") <= len(rec.reports)
    # every sequence released on both workers
    assert target.seqs == {} and draft.seqs == {}
    if isinstance(policy, FixedChain):
        assert draft.num_drafted > 0 and any(r.accepted_lens for r in reqs)
        # speculation actually saved target steps
        assert len(rec.reports) < max(r.max_new_tokens for r in reqs) + len(reqs)
    else:
        assert not any(m in ("prefill", "speculate") for m, _ in draft.calls)


def test_lossless_staggered_arrivals_with_run():
    """Requests arriving while others decode (run() in the background, virtual time)."""
    clock = FakeClock()
    sched, target, draft, lm = make(
        FixedChain(3), clock=clock, max_batch_size=3, target_kw=dict(prefill_s=0.01, verify_s=0.02)
    )
    reqs = mixed_requests(9, seed=7)

    async def main():
        loop_task = asyncio.create_task(sched.run())
        consumers = []
        for req in reqs:
            consumers.append(asyncio.create_task(consume(sched.submit(req))))
            await clock.sleep(0.03)
        outs = await asyncio.gather(*consumers)
        sched.stop()
        await loop_task
        return outs

    outs = asyncio.run(main())
    for req, (tokens, events) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens)
        check_stream(events, tokens)
    assert draft.mismatches == []
    assert clock.now() > 0.2  # virtual time advanced through the worker latencies


def test_tree_shape_policy_is_lossless():
    class Tree(SpeculationPolicy):
        def decide(self, batch, ctx):
            return [SpecShape.tree(3, 2)] * len(batch)

    sched, _, draft, lm = make(Tree())
    reqs = mixed_requests(6, seed=2)
    outs = asyncio.run(run_all(sched, reqs))
    for req, (tokens, _) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens)
    assert draft.mismatches == []
    spec = [r for r in reqs if r.accepted_lens]
    assert spec and all(len(r.position_drafted) <= 3 for r in spec)
    assert all(r.num_drafted_tokens >= sum(r.accepted_lens) for r in spec)


def test_request_modes_override_policy():
    sched, _, draft, lm = make(NoSpeculation())
    fixed = Request("fixed", [1, 2, 3], max_new_tokens=30, speculation=SpeculationSetting(SpecMode.FIXED, 4))
    auto = Request("auto", [4, 5], max_new_tokens=30)
    outs = asyncio.run(run_all(sched, [fixed, auto]))
    assert outs[0][0] == lm.generate(fixed.prompt_ids, 30) and outs[1][0] == lm.generate(auto.prompt_ids, 30)
    assert fixed.accepted_lens and len(fixed.position_drafted) == 4
    assert auto.accepted_lens == [] and auto.num_drafted_tokens == 0

    sched, _, draft, lm = make(FixedChain(3))
    seen_on_draft = set()

    class Spy(NullObserver):
        def on_step(self, report):
            seen_on_draft.update(draft.seqs)

    sched.add_observer(Spy())
    off = Request("off", [1, 2, 3], max_new_tokens=30, speculation=SpeculationSetting(SpecMode.OFF))
    on = Request("on", [4, 5], max_new_tokens=30)
    outs = asyncio.run(run_all(sched, [off, on]))
    assert outs[0][0] == lm.generate(off.prompt_ids, 30)
    assert off.num_drafted_tokens == 0 and "off" not in seen_on_draft
    assert on.num_drafted_tokens > 0 and "on" in seen_on_draft


def test_speculation_capped_by_remaining_tokens():
    rec = Recorder()
    sched, _, _, lm = make(FixedChain(5), agree=1.0, observers=[rec])
    req = Request("r", [7, 8, 9], max_new_tokens=4)
    (tokens, _), = asyncio.run(run_all(sched, [req]))
    assert tokens == lm.generate([7, 8, 9], 4)
    # first token from prefill, then one step: a chain of 2 (+ bonus) fills the remaining 3 exactly
    assert [o.shape for r in rec.reports for o in r.outcomes] == [SpecShape.chain(2)]
    assert req.accepted_lens == [2]


# ----------------------------------------------------------------------------- draft failures


class ToggleDraft(NullObserver):
    """Takes the draft down after step ``down_at`` and brings it back after step ``up_at``."""

    def __init__(self, draft: FakeDraft, down_at: int, up_at: int, crash: bool = False) -> None:
        self.draft, self.down_at, self.up_at, self.crash = draft, down_at, up_at, crash
        self.reports: list[StepReport] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)
        if report.step == self.down_at:
            self.draft.crash() if self.crash else setattr(self.draft, "down", True)
        if report.step == self.up_at:
            self.draft.down = False
            self.calls_at_up = len(self.draft.calls)


@pytest.mark.parametrize("crash", [False, True], ids=["flaky", "crash"])
def test_draft_failure_degrades_and_recovers(crash):
    sched, target, draft, lm = make(FixedChain(3), draft_retry_initial_s=0.0)
    toggle = ToggleDraft(draft, down_at=3, up_at=8, crash=crash)
    sched.add_observer(toggle)
    reqs = [Request(f"r{i}", [i + 1, 2 * i + 3], max_new_tokens=60) for i in range(4)]
    outs = asyncio.run(run_all(sched, reqs))

    for req, (tokens, events) in zip(reqs, outs):
        assert req.state is RequestState.FINISHED
        assert tokens == lm.generate(req.prompt_ids, 60)
        check_stream(events, tokens)
    assert draft.mismatches == []
    reports = toggle.reports
    assert reports[4].draft_error is not None and not reports[4].draft_available
    assert all(r.num_speculating == 0 for r in reports[4:9])  # steps 4..8 ran while it was down
    assert any(r.num_speculating > 0 for r in reports[9:])  # and speculation resumed after
    # on recovery the draft was cleared of what it may hold, then re-prefilled with every sequence
    after_up = draft.calls[toggle.calls_at_up :]
    assert after_up[:3] == [("release", 4), ("prefill", 4), ("speculate", 4)]
    assert target.seqs == {} and draft.seqs == {}


def test_draft_down_from_start_then_backoff():
    clock = FakeClock()
    sched, target, draft, lm = make(
        FixedChain(2), clock=clock, draft_retry_initial_s=0.05, draft_retry_max_s=0.2, target_kw=dict(verify_s=0.01)
    )
    draft.down = True
    reqs = mixed_requests(4, seed=4)
    for r in reqs:
        r.max_new_tokens = 80

    async def main():
        streams = [sched.submit(r) for r in reqs]
        task = asyncio.gather(*(consume(s) for s in streams))
        await sched.run_until_idle(max_steps=40)
        calls_while_down = len(draft.calls)
        draft.down = False
        await sched.run_until_idle()
        return await task, calls_while_down

    outs, calls_while_down = asyncio.run(main())
    for req, (tokens, _) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, 80)
    # 40 steps of 10 ms while down, backoff 50, 100, 200, 200 ms: only a handful of attempts
    assert 2 <= calls_while_down <= 6
    assert any(r.accepted_lens for r in reqs) and draft.mismatches == []


def test_malformed_draft_tree_is_ignored():
    class BadTrees(FakeDraft):
        async def speculate(self, items):
            trees = await super().speculate(items)
            return [TokenTree([1, 2], [1, -1]) if i == 0 else t for i, t in enumerate(trees)]

    lm = ToyLM(vocab_size=50, seed=3)
    target = FakeTarget(lm)
    draft = BadTrees(ToyDraftLM(lm, 0.7), reference=target)
    sched = Scheduler(target, draft, clock=FakeClock(), spec_policy=FixedChain(3))
    reqs = mixed_requests(3)
    outs = asyncio.run(run_all(sched, reqs))
    for req, (tokens, _) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens)


# ----------------------------------------------------------------------------- target failures


def test_target_verify_failure_fails_batch_with_clear_error_and_loop_continues():
    class Flaky(FakeTarget):
        n = 0

        async def verify(self, items):
            self.n += 1
            if self.n == 3:
                raise ConnectionError("target went away")
            return await super().verify(items)

    lm = ToyLM(vocab_size=50, seed=3)
    target = Flaky(lm)
    draft = FakeDraft(ToyDraftLM(lm), reference=target)
    no_recovery = SchedulerConfig(target_recovery=TargetRecoveryConfig(recovery_s=0))  # else it is waited out
    sched = Scheduler(target, draft, clock=FakeClock(), spec_policy=FixedChain(2), config=no_recovery)
    reqs = [Request(f"r{i}", [i, i + 1], max_new_tokens=20) for i in range(3)]
    late = Request("late", [9, 9, 9], max_new_tokens=10)

    async def main():
        streams = [sched.submit(r) for r in reqs]
        outs = asyncio.gather(*(consume(s) for s in streams))
        await sched.run_until_idle()
        late_out = asyncio.ensure_future(consume(sched.submit(late)))
        await sched.run_until_idle()
        return await outs, await late_out

    outs, (late_tokens, _) = asyncio.run(main())
    for req, (tokens, events) in zip(reqs, outs):
        assert req.state is RequestState.FAILED and req.finish_reason is FinishReason.ERROR
        final = events[-1]
        assert final.finished and final.state is RequestState.FAILED
        assert "target verify failed" in final.error and "target went away" in final.error
        assert final.error_code == "UNAVAILABLE"
        assert tokens == lm.generate(req.prompt_ids, 20)[: len(tokens)]  # what was streamed was right
    assert late.state is RequestState.FINISHED and late_tokens == lm.generate(late.prompt_ids, 10)
    assert target.seqs == {} and draft.seqs == {}


def test_target_prefill_error_code_passes_through():
    from shared.engine.errors import ContextLengthError

    class TooLong(FakeTarget):
        async def prefill(self, items):
            raise ContextLengthError("prompt longer than the context window")

    lm = ToyLM()
    sched = Scheduler(TooLong(lm), clock=FakeClock())
    req = Request("r", [1] * 5, max_new_tokens=3)
    ((tokens, events),) = asyncio.run(run_all(sched, [req]))
    assert tokens == [] and events[-1].error_code == "OUT_OF_RANGE" and req.state is RequestState.FAILED


# ----------------------------------------------------------------------------- stop conditions


@pytest.mark.parametrize("policy", [NoSpeculation(), FixedChain(5)], ids=["plain", "chain5"])
def test_stop_token_truncates(policy):
    sched, target, _, lm = make(policy, agree=0.9)
    prompt = [3, 1, 4, 1, 5]
    full = lm.generate(prompt, 40)
    stop = full[12]
    cut = full.index(stop)
    req = Request("r", prompt, max_new_tokens=40, stop_token_ids=[stop])
    ((tokens, events),) = asyncio.run(run_all(sched, [req]))
    assert tokens == full[: cut + 1] == lm.generate(prompt, 40, stop_token_ids=[stop])
    assert req.finish_reason is FinishReason.STOP_TOKEN and events[-1].finish_reason is FinishReason.STOP_TOKEN
    check_stream(events, tokens)
    assert target.seqs == {}


@pytest.mark.parametrize("policy", [NoSpeculation(), FixedChain(5)], ids=["plain", "chain5"])
def test_stop_string_truncates(policy):
    sched, _, _, lm = make(policy, agree=0.9)
    prompt = [2, 7, 1, 8]
    full = lm.generate(prompt, 40)
    stop = toy_detokenize(full[15:18])
    cut = next(i for i in range(len(full)) if stop in toy_detokenize(full[: i + 1]))
    req = Request("r", prompt, max_new_tokens=40, stop_strings=["never-matches", stop])
    ((tokens, events),) = asyncio.run(run_all(sched, [req]))
    assert tokens == full[: cut + 1]
    assert toy_detokenize(tokens).endswith(stop) or stop in toy_detokenize(tokens)
    assert req.finish_reason is FinishReason.STOP_STRING


def test_first_token_can_finish():
    sched, target, draft, lm = make(FixedChain(3))
    first = lm.next_token([5, 6])
    a = Request("a", [5, 6], max_new_tokens=1)
    b = Request("b", [5, 6, 7], max_new_tokens=10, stop_token_ids=[lm.next_token([5, 6, 7])])
    outs = asyncio.run(run_all(sched, [a, b]))
    assert outs[0][0] == [first] and a.finish_reason is FinishReason.LENGTH
    assert len(outs[1][0]) == 1 and b.finish_reason is FinishReason.STOP_TOKEN
    assert target.seqs == {} and draft.seqs == {}
    assert not any(m == "verify" for m, _ in target.calls)


def test_stop_strings_need_detokenizer():
    sched = Scheduler(FakeTarget(ToyLM()), clock=FakeClock())
    with pytest.raises(ValueError, match="detokenizer"):
        sched.submit(Request("r", [1], stop_strings=["x"]))


# ----------------------------------------------------------------------------- abort


def test_abort_mid_stream():
    sched, target, draft, lm = make(FixedChain(2))
    victim = Request("victim", [1, 2, 3], max_new_tokens=200)
    other = Request("other", [4, 5, 6], max_new_tokens=50)

    async def main():
        s_victim, s_other = sched.submit(victim), sched.submit(other)

        async def abort_after_some():
            got = []
            async for ev in s_victim:
                got.append(ev)
                if sum(len(e.token_ids) for e in got) >= 5 and not ev.finished:
                    assert sched.abort("victim")
            return got

        _, events, (other_tokens, _) = await asyncio.gather(
            sched.run_until_idle(), abort_after_some(), consume(s_other)
        )
        return events, other_tokens

    events, other_tokens = asyncio.run(main())
    final = events[-1]
    assert final.finished and final.state is RequestState.ABORTED and final.finish_reason is FinishReason.ABORTED
    streamed = [t for e in events for t in e.token_ids]
    assert streamed == victim.output_ids == lm.generate(victim.prompt_ids, 200)[: len(streamed)]
    assert len(streamed) < 200 and victim.state is RequestState.ABORTED
    assert other_tokens == lm.generate(other.prompt_ids, 50)
    assert target.seqs == {} and draft.seqs == {}  # released on both
    assert sched.abort("victim") is False  # no longer live


def test_abort_waiting_request():
    sched, target, _, _ = make(NoSpeculation(), max_batch_size=1)
    first = Request("first", [1], max_new_tokens=5)
    queued = Request("queued", [2], max_new_tokens=5)

    async def main():
        s1, s2 = sched.submit(first), sched.submit(queued)
        await sched.step()  # "first" is running, "queued" waits (batch cap 1)
        assert sched.waiting == (queued,)
        assert sched.abort("queued")
        await sched.run_until_idle()
        return await consume(s1), await consume(s2)

    (t1, _), (t2, e2) = asyncio.run(main())
    assert len(t1) == 5 and t2 == [] and [e.state for e in e2] == [RequestState.ABORTED]
    assert all("queued" not in str(c) for c in target.calls) and target.seqs == {}


# ----------------------------------------------------------------------------- admission


def test_fcfs_priority_order_and_batch_cap():
    rec = Recorder()
    sched, target, _, _ = make(NoSpeculation(), max_batch_size=2, observers=[rec])
    prios = {"a": 1, "b": 0, "c": 1, "d": -1, "e": 0}
    reqs = [Request(k, [ord(k) % 50], max_new_tokens=3, priority=p) for k, p in prios.items()]
    asyncio.run(run_all(sched, reqs))
    admitted = [rid for r in rec.reports for rid in r.prefilled_ids]
    assert admitted == ["d", "b", "e", "a", "c"]  # strict priority (lower first), FCFS among equals
    assert max(r.batch_size for r in rec.reports) == 2


def test_tokens_in_flight_cap():
    rec = Recorder()
    sched, _, _, _ = make(NoSpeculation(), max_tokens_in_flight=20, observers=[rec])
    reqs = [Request(f"r{i}", [1] * 5, max_new_tokens=10) for i in range(3)]  # 15 tokens each: one at a time
    asyncio.run(run_all(sched, reqs))
    assert max(r.batch_size for r in rec.reports) == 1
    with pytest.raises(ValueError, match="tokens in flight"):
        sched.submit(Request("huge", [1] * 15, max_new_tokens=10))


def test_preemption_by_queue_policy_is_lossless():
    class PreemptOnce(FCFS):
        done = False

        def schedule(self, waiting, running, capacity, now):
            adm = super().schedule(waiting, running, capacity, now)
            if not self.done and len(running) == capacity.max_batch_size and waiting:
                self.done = True
                return Admission(admit=[], preempt=[running[0]])
            return adm

    sched, target, draft, lm = make(FixedChain(3), max_batch_size=2, queue_policy=PreemptOnce())
    reqs = [Request(f"r{i}", [i + 1, i + 2], max_new_tokens=25) for i in range(3)]
    outs = asyncio.run(run_all(sched, reqs))
    for req, (tokens, events) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, 25)
        check_stream(events, tokens)
    assert sum(r.num_preemptions for r in reqs) == 1
    assert draft.mismatches == [] and target.seqs == {} and draft.seqs == {}


# ----------------------------------------------------------------------------- timing and observers


def test_timestamps_ttft_tpot_and_phase_times_on_fake_clock():
    clock = FakeClock(start=100.0)
    rec = Recorder()
    sched, _, _, _ = make(
        NoSpeculation(), clock=clock, observers=[rec], target_kw=dict(prefill_s=0.25, verify_s=0.05)
    )
    req = Request("r", [1, 2, 3], max_new_tokens=5)
    asyncio.run(run_all(sched, [req]))
    assert req.arrival_time == 100.0
    assert req.ttft == pytest.approx(0.25)
    assert req.tpot == pytest.approx(0.05)
    assert req.token_times == pytest.approx([100.25, 100.30, 100.35, 100.40, 100.45])
    first = rec.reports[0].times
    assert first.prefill == pytest.approx(0.25) and first.verify == pytest.approx(0.05)
    assert first.total == pytest.approx(0.30) and first.overhead == pytest.approx(0.0, abs=1e-9)
    assert req.attained_service_s == pytest.approx(4 * 0.05)  # E_i: the four verifies, not the prefill
    assert req.attained_rounds == 4


def test_parallel_prefill_on_both_workers_overlaps_in_virtual_time():
    clock = FakeClock()
    rec = Recorder()
    lm = ToyLM()
    target = FakeTarget(lm, clock, prefill_s=0.2)
    draft = FakeDraft(ToyDraftLM(lm), clock, prefill_s=0.15)
    sched = Scheduler(target, draft, clock=clock, spec_policy=FixedChain(2), observers=[rec])
    asyncio.run(run_all(sched, [Request("r", [1, 2], max_new_tokens=3)]))
    assert rec.reports[0].times.prefill == pytest.approx(0.2)


def test_async_and_failing_observers_do_not_stop_the_loop():
    seen = []

    class AsyncObs(NullObserver):
        async def on_step(self, report):
            await asyncio.sleep(0)
            seen.append(report.step)

    class Broken(NullObserver):
        def on_step(self, report):
            raise RuntimeError("metrics backend down")

    sched, _, _, lm = make(FixedChain(2), observers=[Broken(), AsyncObs()])
    req = Request("r", [1, 2], max_new_tokens=12)
    ((tokens, _),) = asyncio.run(run_all(sched, [req]))
    assert tokens == lm.generate([1, 2], 12) and seen == list(range(len(seen))) and seen


def test_duplicate_and_resubmitted_requests_rejected():
    sched, _, _, _ = make()
    req = Request("dup", [1, 2], max_new_tokens=3)
    sched.submit(req)
    with pytest.raises(ValueError, match="already live"):
        sched.submit(Request("dup", [1], max_new_tokens=3))
    asyncio.run(sched.run_until_idle())
    with pytest.raises(ValueError, match="fresh"):
        sched.submit(req)


# ----------------------------------------------------------------------------- robustness


def test_abort_while_draft_registers_does_not_leak():
    holder = {}

    class AbortingDraft(FakeDraft):
        async def prefill(self, items):
            await super().prefill(items)
            holder["sched"].abort(items[0].seq_id)  # the client goes away mid-call

    lm = ToyLM()
    target = FakeTarget(lm)
    draft = AbortingDraft(ToyDraftLM(lm), reference=target)
    sched = holder["sched"] = Scheduler(target, draft, clock=FakeClock(), spec_policy=FixedChain(2))
    req = Request("r", [1, 2], max_new_tokens=10)
    ((tokens, events),) = asyncio.run(run_all(sched, [req]))
    assert events[-1].state is RequestState.ABORTED
    assert target.seqs == {} and draft.seqs == {}


def test_failing_speculation_policy_degrades_to_plain_decoding():
    class Broken(SpeculationPolicy):
        def decide(self, batch, ctx):
            raise ZeroDivisionError("bug")

    sched, _, draft, lm = make(Broken())
    reqs = mixed_requests(3)
    outs = asyncio.run(run_all(sched, reqs))
    for req, (tokens, _) in zip(reqs, outs):
        assert tokens == lm.generate(req.prompt_ids, req.max_new_tokens)
    assert not any(m == "speculate" for m, _ in draft.calls)


def test_run_fails_requests_instead_of_hanging_on_a_scheduler_bug():
    class BrokenQueue(FCFS):
        def schedule(self, waiting, running, capacity, now):
            raise RuntimeError("queue bug")

    sched, _, _, _ = make(queue_policy=BrokenQueue())

    async def main():
        task = asyncio.create_task(sched.run())
        tokens, events = await consume(sched.submit(Request("r", [1], max_new_tokens=3)))
        sched.stop()
        await task
        return events

    events = asyncio.run(main())
    assert events[-1].state is RequestState.FAILED and "queue bug" in events[-1].error
    assert events[-1].error_code == "INTERNAL"


def test_stop_before_the_loop_task_first_runs_still_stops_it():
    """What a start-up that fails right after creating the loop task does (a port in use)."""
    sched, _, _, _ = make()

    async def main():
        task = asyncio.create_task(sched.run())
        sched.stop()  # before the task has run at all
        await asyncio.wait_for(task, timeout=5)

    asyncio.run(main())
