"""Decode run-ahead over a real target service: the next plain decode leaves before the loop asks, and
nothing the loop sees changes (services/scheduler/run_ahead.py).

Target-only schedulers over StepStream with and without run-ahead, on the same requests: greedy output
equal to transformers', seeded sampling equal to the run without run-ahead, stop tokens, aborts and
late arrivals (a prefill joining decodes sent ahead), a target restarted mid-run, and nothing held
by the target at the end.
"""

from __future__ import annotations

import asyncio

import pytest

from scheduler.engine_loop import Scheduler
from scheduler.request import FinishReason, Request, RequestState
from scheduler.workers import NullObserver
from services.model_main import start as start_model
from services.scheduler.run_ahead import RunAhead
from services.scheduler.stream_workers import StreamTargetWorker
from shared.engine.types import AcceptResult, SamplingParams, TokenTree, VerifyItem
from tests.support.model_services import NUM_BLOCKS, greedy_reference, model_settings, serving

PROMPTS = [[3, 14, 15, 92, 65], [35, 89], [79, 32, 38, 46], [26, 43, 38, 32, 79, 50, 28, 84]]


def requests(tag: str, sampling: SamplingParams | None = None) -> list[Request]:
    return [Request(id=f"{tag}{i}", prompt_ids=p, max_new_tokens=6 + 3 * i, sampling=sampling or SamplingParams())
            for i, p in enumerate(PROMPTS)]  # fmt: skip


class Late(NullObserver):
    """Submits ``req`` after step ``step``: its prefill joins sequences whose next decode already left."""

    def __init__(self, sched_ref: list, req: Request, step: int) -> None:
        self.sched_ref, self.req, self.step = sched_ref, req, step
        self.stream = None

    def on_step(self, report) -> None:
        if report.step == self.step:
            self.stream = self.sched_ref[0].submit(self.req)


async def drive(address: str, reqs: list[Request], *, run_ahead: bool, observers=(), abort_at: int | None = None,
                repeat: int = 0):  # fmt: skip
    target = StreamTargetWorker(address, timeout_s=10)
    target.run_ahead = RunAhead(repeat=repeat) if run_ahead else None
    sched = Scheduler(target, None, observers=list(observers))
    for obs in observers:
        if isinstance(obs, Late):
            obs.sched_ref.append(sched)
    streams = [sched.submit(r) for r in reqs]

    async def abort_later() -> None:
        while abort_at is not None and sched._num_steps < abort_at:
            await asyncio.sleep(0)
        if abort_at is not None:
            sched.abort(reqs[-1].id)

    try:
        _, _, *outs = await asyncio.gather(sched.run_until_idle(), abort_later(), *(s.collect() for s in streams))
        late = [o for o in observers if isinstance(o, Late)]
        for obs in late:
            outs.append(await obs.stream.collect())
        await sched.run_until_idle()
        info = await target.info()
    finally:
        await target.close()
    return outs, info, target.run_ahead


REPEATS = pytest.mark.parametrize("repeat", [0, 1, 3], ids=["one-plan-per-step", "repeat-1", "repeat-3"])


@REPEATS
def test_greedy_decoding_with_run_ahead_equals_transformers_and_frees_everything(tiny_model_dir, repeat):
    reqs = requests("g")
    first = greedy_reference(tiny_model_dir, tuple(PROMPTS[1]), 8)
    reqs[1].stop_token_ids = [first[2]]  # ends early: its decode sent ahead is dropped, its release rides along
    late = Late([], Request(id="late", prompt_ids=[5, 6, 7], max_new_tokens=7), step=2)

    async def main():
        async with serving(tiny_model_dir) as (t, _):
            return await drive(t.address, reqs, run_ahead=True, observers=[late], repeat=repeat)

    outs, info, ahead = asyncio.run(main())
    for req, out in zip([*reqs, late.req], outs):
        assert req.state is RequestState.FINISHED, req.error
        expected = greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
        if req.stop_token_ids:
            assert req.finish_reason is FinishReason.STOP_TOKEN
            expected = expected[: expected.index(req.stop_token_ids[0]) + 1]
        assert out == req.output_ids == expected
    assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)  # ahead results of ended ones released
    assert ahead.num_plans > 5 // (repeat + 1) and ahead.num_used > 10 and ahead.num_dropped >= 1 and not ahead.results
    assert ahead.num_went_on > 0 or repeat != 1  # plans that went on while nothing was released (at 3: no room)


@REPEATS
def test_seeded_sampling_and_an_abort_match_the_run_without_run_ahead(tiny_model_dir, repeat):
    def sampled(tag):
        return requests(tag, SamplingParams(temperature=0.9, top_p=0.95, seed=11))

    async def main():
        async with serving(tiny_model_dir) as (t, _):
            off = await drive(t.address, sampled("s"), run_ahead=False, abort_at=3)
            on = await drive(t.address, sampled("s"), run_ahead=True, abort_at=3, repeat=repeat)
            return off, on

    (outs_off, info_off, _), (outs_on, info_on, ahead) = asyncio.run(main())
    assert outs_on[:-1] == outs_off[:-1] and all(outs_on[:-1])  # the aborted one stops wherever the abort lands
    for info in (info_off, info_on):
        assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)
    assert ahead.num_used > 0


class RestartTargetAt(NullObserver):
    def __init__(self, holder: dict, model_dir, step: int) -> None:
        self.holder, self.model_dir, self.step = holder, model_dir, step

    async def on_step(self, report) -> None:
        if report.step == self.step:
            old = self.holder["target"]
            await old.stop(0)
            self.holder["target"] = await start_model(model_settings(self.model_dir, port=old.port), "target")


@REPEATS
def test_a_target_restarted_with_a_decode_sent_ahead_loses_nothing(tiny_model_dir, repeat):
    reqs = requests("r")

    async def main():
        async with serving(tiny_model_dir) as (t, _):
            holder = {"target": t}
            try:
                return await drive(t.address, reqs, run_ahead=True, observers=[RestartTargetAt(holder, tiny_model_dir, 3)],
                                   repeat=repeat)  # fmt: skip
            finally:
                if holder["target"] is not t:
                    await holder["target"].stop(0)

    outs, info, ahead = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert req.state is RequestState.FINISHED and req.finish_reason is FinishReason.LENGTH, req.error
        assert out == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
    assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)


def test_results_sent_ahead_are_kept_per_sequence_until_asked_for():
    ahead = RunAhead()
    a, b, c = (AcceptResult([], [t], []) for t in (1, 2, 3))
    ahead.keep(["a", "b", "c"], [a, b, c], released={"c"})  # c ended after the plan left
    assert set(ahead.results) == {"a", "b"} and ahead.num_dropped == 1
    items = [VerifyItem("new", TokenTree()), VerifyItem("b", TokenTree())]  # a is preempted: b's stays, a's waits
    hits, misses = ahead.split(items)
    assert hits == {1: b} and [m.seq_id for m in misses] == ["new"] and set(ahead.results) == {"a"}
    computed = AcceptResult([], [9], [])
    assert ahead.merge(items, hits, [computed]) == [computed, b]
    with pytest.raises(RuntimeError, match="tree"):  # a tree for a sequence decoded ahead: out of step
        ahead.split([VerifyItem("a", TokenTree(token_ids=[4], parent_ids=[-1]))])
    ahead.drop(["a", "zzz"])
    assert not ahead.results


def test_a_continuations_results_queue_behind_the_plans_and_releases_drop_them():
    ahead = RunAhead(repeat=1)
    first, second = AcceptResult([], [1], []), AcceptResult([], [2], [])
    ahead.keep(["a"], [first], released=set())
    ahead.keep(["a"], [second], released=set())  # the continuation's, read before the loop took the first
    hits, _ = ahead.split([VerifyItem("a", TokenTree())])
    assert hits == {0: first} and ahead.buffered(["a"])
    hits, _ = ahead.split([VerifyItem("a", TokenTree())])
    assert hits == {0: second} and not ahead.buffered(["a"])
    ahead.released.add("b")  # released after the plan left: a continuation still owed decodes it for nothing
    ahead.keep(["b"], [first], released=set())
    assert not ahead.results and ahead.num_dropped == 1
