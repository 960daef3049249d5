"""A plan's continuation steps over a real target service (TargetPlan.repeat, services/target/repeat_plan.py): one
plan, R+1 outcomes numbered on from its step, each the step the scheduler would have planned: plain decodes,
or relayed verifies that take the draft's trees. A refused plan's continuations answer its error and commit
nothing; continuations nobody read are drained before the next exchange. A plan that goes on (TargetPlan.goes_on)
continues the stream's last step for 1 + R more."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest

from services.scheduler.grpc_workers import WorkerRpcError
from services.scheduler.stream_workers import StreamTargetWorker
from services.target.repeat_plan import check_repeat
from shared.engine.types import RELAY_TAKE, PrefillItem, SpecItem, TokenTree, VerifyItem
from shared.rpc.gen.tandem.v1 import target_pb2
from shared.rpc.packing import pack_trees, unpack_accepts
from tests.services.test_relay_over_grpc import relaying
from tests.support.model_services import greedy_reference, serving

PROMPT = [3, 14, 15, 92, 65, 35]


def _decode(ids, repeat):
    return target_pb2.TargetPlan(verify_ids=ids, trees=pack_trees([TokenTree()] * len(ids)), repeat=repeat)


@asynccontextmanager
async def prefilled(model_dir, **overrides):
    """A target service, the scheduler's stream worker to it, and sequence "a" prefilled: (worker, its tokens)."""
    async with serving(model_dir, **overrides) as (target, _):
        tw = StreamTargetWorker(target.address, timeout_s=10)
        try:
            yield tw, [(await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token]
        finally:
            await tw.close()


def test_a_decode_plan_with_continuations_answers_each_step_and_the_tokens_are_the_targets(tiny_model_dir):
    async def main():
        async with prefilled(tiny_model_dir) as (tw, out):
            stream = tw.stream
            step = await stream.send(_decode(["a"], 2))
            for k in range(3):  # the plan's step, then its two continuations
                reply = await stream.receive(step + k)
                assert reply.step == step + k and not reply.HasField("error")
                out += unpack_accepts(reply.accepts, [0])[0].tokens
            assert not stream.owes
            # the next plan is numbered after the continuations, and the stream goes on
            out += (await tw.verify([VerifyItem("a")]))[0].tokens
            return out

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out)) and len(out) == 5


@pytest.mark.parametrize("hold_ms, messages", [(100.0, 3 + 3), (0.0, 4 + 4)])
def test_short_steps_send_two_outcomes_in_one_message_and_the_tokens_are_the_targets(tiny_model_dir, hold_ms, messages):
    """services/target/outcome_hold.py: of a plan's four steps the first two outcomes leave together (each read on
    its own all the same), the last two alone; a plan that goes on pairs its first two again."""
    async def main():
        async with prefilled(tiny_model_dir, outcome_hold_ms=hold_ms) as (tw, out):
            stream = tw.stream
            before = stream.messages_in
            step = await stream.send(_decode(["a"], 3))
            for k in range(4):
                if k == 3:  # the last one owed: go on for four more, as the scheduler's worker does
                    await stream.go_on(target_pb2.TargetPlan(goes_on=True, repeat=3))
                reply = await stream.receive(step + k)
                assert reply.step == step + k and not reply.HasField("error")
                out += unpack_accepts(reply.accepts, [0])[0].tokens
            for k in range(4, 8):
                reply = await stream.receive(step + k)
                assert reply.step == step + k
                out += unpack_accepts(reply.accepts, [0])[0].tokens
            assert not stream.owes
            return out, stream.messages_in - before

    out, read = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out)) and len(out) == 9
    assert read == messages


def test_a_refused_plan_and_its_continuations_commit_nothing(tiny_model_dir):
    async def main():
        async with prefilled(tiny_model_dir) as (tw, out):
            stream = tw.stream
            step = await stream.send(_decode(["nobody"], 2))  # an unknown sequence
            replies = [await stream.receive(step + k, in_band_errors=False) for k in range(3)]
            assert all(r.HasField("error") for r in replies) and len({r.error.code for r in replies}) == 1
            # nothing of those ran: the next decode continues the sequence where it was
            out += (await tw.verify([VerifyItem("a")]))[0].tokens
            # an exchanged plan's continuations that nobody reads are drained by the next exchange
            await tw.verify([VerifyItem("a", repeat=2)])
            assert tw.stream.owes
            await tw.verify([VerifyItem("a")])
            return out

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), 2)
    assert "at most 4" in check_repeat(_decode(["a"], 9))  # and such a plan answers that error 1 + 4 times


def test_a_plan_that_goes_on_continues_the_last_step_and_the_tokens_are_the_targets(tiny_model_dir):
    async def main():
        async with prefilled(tiny_model_dir) as (tw, out):
            out += (await tw.verify([VerifyItem("a", repeat=1)]))[0].tokens  # a plan for two steps
            # read the second while asking for two more after it (TargetPlan.goes_on), then one more
            out += (await tw.verify([VerifyItem("a", continued=True, repeat=2)]))[0].tokens
            for more in (1, 0, 0):
                out += (await tw.verify([VerifyItem("a", continued=True, repeat=more)]))[0].tokens
            assert not tw.stream.owes
            out += (await tw.verify([VerifyItem("a")]))[0].tokens  # numbered after them all
            return out, tw.stream.num_opened

    out, opened = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out)) and len(out) == 7 and opened == 1


def test_a_plan_that_goes_on_from_nothing_or_a_refused_step_commits_nothing(tiny_model_dir):
    async def main():
        async with prefilled(tiny_model_dir) as (tw, out):
            stream = tw.stream
            step = await stream.send(_decode(["nobody"], 0))  # refused: an unknown sequence
            assert (await stream.receive(step, in_band_errors=False)).HasField("error")
            step = await stream.send(target_pb2.TargetPlan(goes_on=True, repeat=1))  # goes on from that refusal
            same = [await stream.receive(step + k, in_band_errors=False) for k in range(2)]
            step = await stream.send(target_pb2.TargetPlan(goes_on=True, verify_ids=["a"]))  # more than step and repeat
            bad = await stream.receive(step, in_band_errors=False)
            out += (await tw.verify([VerifyItem("a")]))[0].tokens  # nothing of those ran
            with pytest.raises(WorkerRpcError):  # the worker asks only while a continuation is owed
                await stream.go_on(target_pb2.TargetPlan(goes_on=True))
        async with serving(tiny_model_dir) as (target, _):  # a fresh stream: nothing to go on from
            tw = StreamTargetWorker(target.address, timeout_s=10)
            try:
                step = await tw.stream.send(target_pb2.TargetPlan(goes_on=True))
                fresh = await tw.stream.receive(step, in_band_errors=False)
            finally:
                await tw.close()
        return out, same, bad, fresh

    out, same, bad, fresh = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), 2)
    assert all(r.HasField("error") for r in same) and len({r.error.code for r in same}) == 1
    assert "carries only step and repeat" in bad.error.message
    assert "no step of this stream" in fresh.error.message


def test_relayed_continuations_take_the_drafts_trees(tiny_model_dir):
    async def main():
        async with relaying(tiny_model_dir) as (target, draft, tw, dw):
            out = [(await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token]
            await dw.prefill([PrefillItem("a", PROMPT)])
            tree = (await dw.speculate([SpecItem("a", [out[0]], chain_len=3)]))[0]
            res = (await tw.verify([VerifyItem("a", tree, handoff=SpecItem("a", [], chain_len=3), remaining=60)]))[0]
            out += res.tokens
            for _ in range(3):  # a plan for two steps: the second one the target runs by itself
                item = VerifyItem("a", relay=RELAY_TAKE, handoff=SpecItem("a", [], chain_len=3), remaining=60 - len(out))
                res = (await tw.verify([VerifyItem(**{**item.__dict__, "repeat": 1})]))[0]
                assert res.relayed and not res.relay_missed and len(res.relay_tree) == 3
                out += res.tokens
                res = (await tw.verify([VerifyItem(**{**item.__dict__, "continued": True})]))[0]
                assert res.relayed and not res.relay_missed and len(res.relay_tree) == 3
                out += res.tokens
            assert not tw.stream.owes
            return out

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))


@pytest.mark.parametrize("repeat", [1, 3])
def test_the_loop_with_relayed_continuations_is_lossless_across_ends_and_arrivals(tiny_model_dir, repeat):
    """The scheduler's loop over both services, relaying under a fixed policy with continuation steps: requests that
    end at different steps (their continuations verify them for nothing), then one that arrives when the loop has
    gone idle with a continuation unread (drained before its prefill): greedy output is the target's throughout,
    and nothing is left on either service."""
    from scheduler.engine_loop import Scheduler, SchedulerConfig
    from scheduler.policies.speculation import FixedChain
    from scheduler.request import Request

    first = [Request(id=f"a{i}", prompt_ids=PROMPT[i:], max_new_tokens=40) for i in range(3)]
    for i, req in enumerate(first):  # each ends at a stop token, mid-budget (where continuations still run)
        ref = greedy_reference(tiny_model_dir, tuple(req.prompt_ids), 40)
        k = next(k for k in range(6 + 3 * i, 40) if ref[k] not in ref[:k])
        req.stop_token_ids = [ref[k]]

    async def main():
        async with relaying(tiny_model_dir, relay_lookahead="always") as (target, draft, tw, dw):
            sched = Scheduler(tw, dw, spec_policy=FixedChain(3), config=SchedulerConfig(draft_relay=True))
            sched.verify_ahead.repeat = repeat
            outs = await asyncio.gather(*(s.collect() for s in [sched.submit(r) for r in first]),
                                        sched.run_until_idle())  # fmt: skip
            late = Request(id="late", prompt_ids=PROMPT, max_new_tokens=20)
            stream = sched.submit(late)
            outs = [*outs[:-1], (await asyncio.gather(stream.collect(), sched.run_until_idle()))[0]]
            await tw.flush()
            await dw.flush()
            info = (await tw.info(), await dw.info())
            return [*first, late], outs, info, sched.verify_ahead

    reqs, outs, (tinfo, dinfo), ahead = asyncio.run(main())
    for req, out in zip(reqs, outs):
        ref = greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens)
        if req.stop_token_ids:
            ref = ref[: ref.index(req.stop_token_ids[0]) + 1]
        assert out == ref, req.id
    assert tinfo.num_live_seqs == 0 and dinfo.num_live_seqs == 0
    assert ahead.num_continued > 0
    assert ahead.num_went_on > 0 or repeat > 1  # plans that went on before the last one owed (at 3, none has room)
