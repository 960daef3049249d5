"""Preemption in the loop (LAPS-SD, LAS) against the toy fake workers: lossless, nothing leaked.

Requests arrive in waves while others run, with a batch cap of 2, so the
preemptive policies displace running requests. Three ways back:
kept KV (resumed with no worker call), released and recomputed
(``keep_kv_on_preempt=False``), and evicted under KV pressure.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.policies.acceptance_stability import Stability
from scheduler.policies.laps_sd import LapsConfig, LapsSD
from scheduler.policies.order_baselines import LAS, LPSJF
from scheduler.policies.priority_queues import QueueLevels
from scheduler.policies.speculation import FixedChain
from scheduler.request import FinishReason, Request, RequestState
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM
from scheduler.workers import FakeClock


class AdmissionEvents:
    """Counts the step reports' preemptions, resumptions and evictions (what the metrics observer exports)."""

    def __init__(self) -> None:
        self.preempted = self.resumed = self.evicted = 0

    def on_step(self, report) -> None:
        self.preempted += len(report.preempted_ids)
        self.resumed += len(report.resumed_ids)
        self.evicted += len(report.evicted_ids)

    def on_finish(self, request) -> None:
        pass


def make(queue_policy, events: AdmissionEvents | None = None, **cfg):
    lm = ToyLM(vocab_size=50, seed=3)
    clock = FakeClock()
    target = FakeTarget(lm, clock, prefill_s=0.02, verify_s=0.05)
    draft = FakeDraft(ToyDraftLM(lm, 0.7, seed=5), clock, speculate_s=0.01, reference=target)
    sched = Scheduler(
        target, draft, config=SchedulerConfig(**cfg), clock=clock, spec_policy=FixedChain(3), queue_policy=queue_policy,
        observers=[events] if events else (),
    )  # fmt: skip
    return sched, target, draft, lm


def waves(seed=0, num_waves=4, per_wave=3):
    """(step at which it arrives, request): long and short requests mixed."""
    rng = random.Random(seed)
    out = []
    for w in range(num_waves):
        for i in range(per_wave):
            n = rng.choice([3, 6, 40, 60])
            out.append((w * 6, Request(f"w{w}r{i}", [rng.randrange(50) for _ in range(rng.randint(2, 6))], max_new_tokens=n)))
    return out


async def drive(sched, arrivals, abort_at=None):
    streams, step, pending = {}, 0, list(arrivals)
    while pending or sched.has_work():
        while pending and pending[0][0] <= step:
            req = pending.pop(0)[1]
            streams[req.id] = sched.submit(req)
        if abort_at and step == abort_at[0] and sched.get(abort_at[1]) is not None:
            sched.abort(abort_at[1])
        await sched.step()
        step += 1
        assert step < 5000
    return {rid: await s.collect() for rid, s in streams.items()}


def laps():
    return LapsSD(LapsConfig(levels=QueueLevels(4, 0.15, 2.0, "s"), stability=Stability(3, 0.1)))


POLICIES = {"laps-sd": laps, "las": lambda: LAS(quantum_s=0.15), "lp-sjf": LPSJF}


@pytest.mark.parametrize("keep_kv", [True, False], ids=["keep-kv", "recompute"])
@pytest.mark.parametrize("name", list(POLICIES))
def test_preempted_requests_produce_the_uninterrupted_output(name, keep_kv):
    events = AdmissionEvents()
    sched, target, draft, lm = make(POLICIES[name](), events, max_batch_size=2, keep_kv_on_preempt=keep_kv)
    arrivals = waves()
    outs = asyncio.run(drive(sched, arrivals))
    reqs = [r for _, r in arrivals]
    for r in reqs:
        assert r.state is RequestState.FINISHED
        assert outs[r.id] == r.output_ids == lm.generate(r.prompt_ids, r.max_new_tokens)
    preemptions = sum(r.num_preemptions for r in reqs)
    if name == "lp-sjf":
        assert preemptions == 0
    else:
        assert preemptions > 0
        assert sum(r.num_recomputes for r in reqs) == (0 if keep_kv else preemptions)
    assert (events.preempted, events.evicted) == (preemptions, sum(r.num_recomputes for r in reqs))
    assert events.resumed == (preemptions if keep_kv else 0)
    assert target.seqs == {} and draft.seqs == {} and draft.mismatches == []
    assert not any(r.resident for r in reqs)


def test_kept_kv_is_evicted_under_kv_pressure_and_recomputed():
    # room for about two long requests' reservations: resident ones must give their blocks back
    events = AdmissionEvents()
    sched, target, draft, lm = make(laps(), events, max_batch_size=2, max_tokens_in_flight=140)
    arrivals = waves(seed=1)
    asyncio.run(drive(sched, arrivals))
    reqs = [r for _, r in arrivals]
    assert sum(r.num_preemptions for r in reqs) > 0 and sum(r.num_recomputes for r in reqs) > 0
    assert events.evicted == sum(r.num_recomputes for r in reqs)  # evicted under KV pressure, each re-prefilled
    for r in reqs:
        assert r.output_ids == lm.generate(r.prompt_ids, r.max_new_tokens)
    assert target.seqs == {} and draft.seqs == {} and draft.mismatches == []


def test_resumed_request_costs_no_worker_call():
    sched, target, draft, lm = make(laps(), max_batch_size=2)
    arrivals = waves()
    asyncio.run(drive(sched, arrivals))
    num_prefilled = sum(n for m, n in target.calls if m == "prefill")
    assert num_prefilled == len(arrivals)  # every preempted request came back without a prefill


def test_aborting_a_resident_request_releases_its_kv():
    sched, target, draft, lm = make(laps(), max_batch_size=2)
    arrivals = waves()
    seen_resident: list[str] = []

    async def run():
        streams, step, pending = {}, 0, list(arrivals)
        while pending or sched.has_work():
            while pending and pending[0][0] <= step:
                req = pending.pop(0)[1]
                streams[req.id] = sched.submit(req)
            resident = [r for r in sched.waiting if r.resident]
            if resident and not seen_resident:
                seen_resident.append(resident[0].id)
                assert resident[0].id in target.seqs
                sched.abort(resident[0].id)
            await sched.step()
            step += 1

    asyncio.run(run())
    assert seen_resident, "no request was ever resident: the scenario does not preempt"
    victim = next(r for _, r in arrivals if r.id == seen_resident[0])
    assert victim.finish_reason is FinishReason.ABORTED
    assert target.seqs == {} and draft.seqs == {}
