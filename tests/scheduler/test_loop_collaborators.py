"""The iteration loop's collaborators on their own: DraftLink (draft health, releases, resync),
ElasticControl (offload/reload and the KV pool) and AdmissionControl (caps, preemption, eviction)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from scheduler.admission import AdmissionControl
from scheduler.draft_link import DraftLink
from scheduler.elastic_control import ElasticControl
from scheduler.policies.elastic_memory import ElasticDraftMemory, ElasticMemoryConfig, PoolGrowth
from scheduler.policies.queue import FCFS, Admission
from scheduler.report import StepReport
from scheduler.request import Request, RequestState
from scheduler.workers import FakeClock


class Draft:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.fail = False

    async def _call(self, name, arg=None):
        self.calls.append((name, arg))
        if self.fail:
            raise ConnectionError("draft down")

    async def release(self, ids):
        await self._call("release", list(ids))

    async def prefill(self, items):
        await self._call("prefill", [(it.seq_id, list(it.prompt_ids)) for it in items])

    async def offload(self):
        await self._call("offload")

    async def reload(self):
        await self._call("reload")


class Target:
    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.refuse = False

    async def resize_kv(self, num_blocks):
        if self.refuse:
            raise RuntimeError("blocks in use")
        self.sizes.append(num_blocks)


def _running(rid: str, tokens=(1, 2, 3), out=(4,)) -> Request:
    r = Request(rid, list(tokens), max_new_tokens=8)
    r.state = RequestState.RUNNING
    r.output_ids = list(out)
    return r


# ---- DraftLink ----------------------------------------------------------------------------------------
def test_draft_link_backs_off_marks_stale_and_resyncs_on_recovery():
    clock, draft = FakeClock(), Draft()
    link = DraftLink(draft, clock, retry_initial_s=1.0, retry_max_s=4.0, target=Target())
    a, b = _running("a"), _running("b")
    link.mark(a, a.num_tokens)
    assert a.on_draft and link.usable

    link.failed(ConnectionError("x"), [a, b], also_stale=["gone"])
    assert not link.up and link.stale == {"a", "gone"} and not a.on_draft and "ConnectionError" in link.error
    link.probe()
    assert not link.up  # the backoff has not passed
    clock.advance(1.0)
    link.probe()
    assert link.up
    link.failed(RuntimeError("again"), [])
    assert link.backoff == 2.0  # doubled; capped at retry_max_s
    clock.advance(2.0)
    link.probe()

    asyncio.run(link.sync([a, b]))  # releases what it may hold, re-prefills all but each last token
    assert draft.calls == [("release", ["a", "gone"]), ("prefill", [("a", [1, 2, 3]), ("b", [1, 2, 3])])]
    assert a.on_draft and a.draft_seen == 3 and link.stale == set()
    link.recovered()
    assert link.backoff == 0.0


def test_draft_link_releases_between_calls_and_keeps_ids_while_down():
    draft = Draft()
    link = DraftLink(draft, FakeClock(), retry_initial_s=1.0, retry_max_s=4.0, target=Target())
    a = _running("a")
    link.mark(a, 4)
    link.forget(a)
    assert link.pending_release == ["a"] and not a.on_draft
    draft.fail = True
    asyncio.run(link.flush([]))  # a failed release: the ids wait for the recovery's sync
    assert not link.up and link.stale == {"a"}
    ended = Request("e", [1], max_new_tokens=2)
    ended.state = RequestState.FINISHED
    link.mark(ended, 1)  # ended while its prefill ran: released at once
    assert link.pending_release == ["e"]
    link.offloaded_all([a])
    assert link.offloaded and not link.usable and link.stale == set()


# ---- ElasticControl -----------------------------------------------------------------------------------
class Config:
    pool_growth = PoolGrowth(base_blocks=10, extra_blocks=6, block_size=4)


def test_elastic_control_offloads_grows_the_pool_and_shrinks_it_before_reloading():
    draft, target = Draft(), Target()
    link = DraftLink(draft, FakeClock(), retry_initial_s=1.0, retry_max_s=4.0, target=target)
    memory = ElasticDraftMemory(ElasticMemoryConfig(low_free=0.2, high_free=0.5, persist_steps=2))
    control = ElasticControl(memory, Config(), target, link)
    holder = _running("a")
    link.mark(holder, 4)

    async def steps(n, **kw):
        for _ in range(n):
            report = StepReport(step=0, started_at=0.0)
            await control.after_step(report=report, holders=[holder], **kw)
        return report

    asyncio.run(steps(2, speculated=False, reserved=95, cap=100, num_waiting=3))  # scarce, nothing speculates
    assert ("offload", None) in draft.calls and link.offloaded and not holder.on_draft
    assert target.sizes == [16] and control.extra_tokens == 24
    target.refuse = True  # a grown block is still in use: the target refuses to shrink
    report = asyncio.run(steps(1, speculated=False, reserved=10, cap=100, num_waiting=0))
    assert report.kv_pool_event == "shrink-refused" and link.offloaded and ("reload", None) not in draft.calls
    target.refuse = False
    asyncio.run(steps(memory.config.retry_steps + 1, speculated=False, reserved=10, cap=100, num_waiting=0))
    assert target.sizes == [16, 10] and control.extra_tokens == 0  # shrunk first ...
    assert draft.calls[-1] == ("reload", None) and not link.offloaded  # ... then the draft came back


# ---- AdmissionControl ---------------------------------------------------------------------------------
class Link:
    def __init__(self) -> None:
        self.forgotten: list[str] = []

    def forget(self, req):
        self.forgotten.append(req.id)


class PreemptFirst(FCFS):
    """FCFS that names the oldest running request for preemption once."""

    def __init__(self) -> None:
        super().__init__()
        self.once = True

    def schedule(self, waiting, running, capacity, now):
        adm = super().schedule(waiting, running, capacity, now)
        if self.once and running:
            self.once = False
            return Admission(admit=list(waiting), preempt=[running[0]])
        return adm


@pytest.mark.parametrize("keep_kv", [True, False])
def test_admission_caps_preempts_and_evicts_under_kv_pressure(keep_kv):
    released, link = [], Link()
    caps = SimpleNamespace(max_batch_size=2, keep_kv_on_preempt=keep_kv)
    control = AdmissionControl(PreemptFirst(), caps, link, released.append)
    reqs = [Request(f"r{i}", [1] * 4, max_new_tokens=6, arrival_time=float(i)) for i in range(3)]  # 10 tokens each
    waiting, running = list(reqs), {}
    new = control.admit(waiting, running, budget=100, now=0.0, report=StepReport(step=0, started_at=0.0))
    assert [r.id for r in new] == ["r0", "r1"] and list(running) == ["r0", "r1"]  # batch cap 2

    report = StepReport(step=1, started_at=0.0)
    new = control.admit(waiting, running, budget=100, now=1.0, report=report)
    assert report.preempted_ids == ["r0"] and reqs[0].num_preemptions == 1
    assert [r.id for r in new] == ["r2"] and set(running) == {"r1", "r2"}
    assert reqs[0].resident is keep_kv
    assert released == ([] if keep_kv else ["r0"]) and link.forgotten == ([] if keep_kv else ["r0"])

    if keep_kv:  # the budget shrinks: the resident request is evicted (recomputed later), not the running ones
        control.admit(waiting, running, budget=25, now=2.0, report=StepReport(step=2, started_at=0.0))
        assert not reqs[0].resident and released == ["r0"] and reqs[0].num_recomputes == 1
