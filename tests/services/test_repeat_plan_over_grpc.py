"""A plan's continuation steps over a real target service (TargetPlan.repeat, services/target/repeat_plan.py): one
plan, R+1 outcomes numbered on from its step, each the step the scheduler would have planned: plain decodes,
or relayed verifies that take the draft's trees. A refused plan's continuations answer its error and commit
nothing; continuations nobody read are drained before the next exchange."""

from __future__ import annotations

import asyncio

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


def test_a_decode_plan_with_continuations_answers_each_step_and_the_tokens_are_the_targets(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir) as (target, _):
            tw = StreamTargetWorker(target.address, timeout_s=10)
            try:
                out = [(await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token]
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
            finally:
                await tw.close()

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out)) and len(out) == 5


def test_a_refused_plan_and_its_continuations_commit_nothing(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir) as (target, _):
            tw = StreamTargetWorker(target.address, timeout_s=10)
            try:
                out = [(await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token]
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
            finally:
                await tw.close()

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), 2)
    assert "at most 4" in check_repeat(_decode(["a"], 9))  # and such a plan answers that error 1 + 4 times


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
