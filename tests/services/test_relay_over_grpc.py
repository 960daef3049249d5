"""The draft relay over real services (services/target/draft_relay.py): the target hands a verified step's tokens
to the draft, the draft's next tree comes straight back, and the target verifies it when the plan says so.
Greedy output stays the target's own; a tree that cannot come (never handed off, the draft gone) is a
plain decode step reported missed."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from services.scheduler.stream_workers import StreamDraftWorker, StreamTargetWorker
from shared.engine.types import RELAY_DROP, RELAY_TAKE, PrefillItem, SpecItem, VerifyItem
from tests.support.model_services import greedy_reference, serving

PROMPT = [3, 14, 15, 92, 65, 35]


@asynccontextmanager
async def relaying(model_dir, draft_dir=None, **overrides):
    """A target and a draft service, and the scheduler's stream workers to them, the target relaying to the draft."""
    async with serving(model_dir, draft_dir or model_dir, **overrides) as (target, draft):
        tw, dw = StreamTargetWorker(target.address), StreamDraftWorker(draft.address)
        tw.relay_to = draft.address
        try:
            yield target, draft, tw, dw
        finally:
            await tw.close()
            await dw.close()


def test_relayed_trees_are_verified_and_the_output_is_the_targets(tiny_model_dir):
    async def main():
        async with relaying(tiny_model_dir) as (target, draft, tw, dw):
            first = (await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token
            await dw.prefill([PrefillItem("a", PROMPT)])
            out = [first]
            tree = (await dw.speculate([SpecItem("a", [first], chain_len=3)]))[0]
            item = VerifyItem("a", tree, handoff=SpecItem("a", [], chain_len=3), remaining=40)
            res = (await tw.verify([item]))[0]
            assert res.relayed and not res.relay_missed and res.relay_tree is None
            out += res.tokens
            relayed = 0
            while len(out) < 24:  # every later step: the tree the draft relayed, and the next handoff
                item = VerifyItem("a", relay=RELAY_TAKE, handoff=SpecItem("a", [], chain_len=3), remaining=40 - len(out))
                res = (await tw.verify([item]))[0]
                assert not res.relay_missed and res.relay_tree is not None and len(res.relay_tree) == 3
                assert len(res.node_status) == 3  # the outcome describes the tree the target verified
                relayed += res.relayed
                out += res.tokens
            assert relayed > 0
            # a drop waits for the answer, then decodes; the draft no longer has a handoff out
            res = (await tw.verify([VerifyItem("a", relay=RELAY_DROP)]))[0]
            assert len(res.tokens) == 1 and not res.relay_missed and res.relay_tree is None
            out += res.tokens
            # the draft's copy followed the target's: a plain speculate from the relayed prefix works
            tree = (await dw.speculate([SpecItem("a", res.tokens, chain_len=2)]))[0]
            assert len(tree) == 2
            return out

    out = asyncio.run(main())
    assert out == greedy_reference(tiny_model_dir, tuple(PROMPT), len(out))


def test_a_tree_that_cannot_come_is_a_missed_decode_step(tiny_model_dir):
    async def main():
        async with relaying(tiny_model_dir) as (target, draft, tw, dw):
            first = (await tw.prefill([PrefillItem("a", PROMPT), PrefillItem("b", PROMPT)]))[0].first_token
            # never handed off: missed at once, a plain decode step
            res = (await tw.verify([VerifyItem("a", relay=RELAY_TAKE)]))[0]
            assert res.relay_missed and len(res.tokens) == 1 and res.relay_tree is None
            # handed off for a sequence the draft does not hold (b was never prefilled there): answered missing
            res = (await tw.verify([VerifyItem("b", handoff=SpecItem("b", [first], chain_len=2), remaining=9)]))[0]
            assert res.relayed
            res = (await tw.verify([VerifyItem("b", relay=RELAY_TAKE)]))[0]
            assert res.relay_missed and len(res.tokens) == 1
            # the draft goes away: a handoff made then is never answered, its tree is missed
            await dw.prefill([PrefillItem("a", PROMPT)])
            await dw.flush()
            await draft.stop(0)
            await tw.verify([VerifyItem("a", handoff=SpecItem("a", [first], chain_len=2), remaining=9)])
            res = (await tw.verify([VerifyItem("a", relay=RELAY_TAKE)]))[0]
            assert res.relay_missed and len(res.tokens) >= 1
            # the stream failed: nothing is relayed for a while, the scheduler drafts those itself
            res = (await tw.verify([VerifyItem("a", handoff=SpecItem("a", [], chain_len=2), remaining=9)]))[0]
            return res.relayed

    assert asyncio.run(main()) is False


def test_a_release_settles_the_handoff_and_a_capped_shape_is_not_handed_off(tiny_model_dir):
    async def main():
        async with relaying(tiny_model_dir) as (target, draft, tw, dw):
            first = (await tw.prefill([PrefillItem("a", PROMPT)]))[0].first_token
            await dw.prefill([PrefillItem("a", PROMPT)])
            await dw.flush()
            # one token left before the step: nothing to draft after it
            res = (await tw.verify([VerifyItem("a", handoff=SpecItem("a", [first], chain_len=3), remaining=1)]))[0]
            assert not res.relayed
            res = (await tw.verify([VerifyItem("a", handoff=SpecItem("a", [first], chain_len=3), remaining=30)]))[0]
            assert res.relayed
            await tw.release(["a"])
            await tw.flush()  # the release waits for a's answer, then goes
            return target.engine_host.draft_relay

    relay = asyncio.run(main())
    assert not relay._where and not relay._answers  # settled and forgotten


def test_a_malformed_relay_plan_is_refused_in_band_and_commits_nothing(tiny_model_dir):
    """Relay fields that do not add up answer the step's INVALID_ARGUMENT before anything runs; the stream goes on."""
    from shared.rpc.channel import aio_channel
    from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2, target_pb2_grpc
    from shared.rpc.packing import pack_i32, pack_trees
    from shared.engine.types import TokenTree

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (target, draft), aio_channel(target.address) as channel:
            call = target_pb2_grpc.TargetServiceStub(channel).StepStream()
            prefill = target_pb2.TargetPlan(step=1)
            prefill.prefills.add(seq_id="a", prompt_ids=pack_i32(PROMPT))
            await call.write(prefill)
            first = await call.read()
            assert not first.HasField("error")
            verify = dict(verify_ids=["a"], trees=pack_trees([TokenTree()]))
            bad = [target_pb2.TargetPlan(step=2, relay_flags=b"\x01\x01", **verify),  # two flags, one verify
                   target_pb2.TargetPlan(step=3, relay_flags=b"\x07", **verify)]  # no such flag  # fmt: skip
            wrong_remaining = target_pb2.TargetPlan(step=4, **verify)
            wrong_remaining.relay.draft = draft.address
            wrong_remaining.relay.chains.seq_ids.append("a")
            wrong_remaining.relay.chains.num_new_tokens = pack_i32([0])
            wrong_remaining.relay.chains.chain_lengths = pack_i32([2])
            wrong_remaining.relay.remaining = pack_i32([5, 6])  # two counts for one chain
            codes = []
            for plan in [*bad, wrong_remaining]:
                await call.write(plan)
                out = await call.read()
                codes.append(out.error.code)
            await call.write(target_pb2.TargetPlan(step=5, **verify))  # the stream goes on; nothing was committed
            good = await call.read()
            await call.done_writing()
            return codes, first, good

    codes, first, good = asyncio.run(main())
    from shared.rpc.packing import unpack_accepts, unpack_i32

    assert codes == [3, 3, 3]  # INVALID_ARGUMENT, in band
    tokens = unpack_i32(first.first_tokens) + unpack_accepts(good.accepts, [0])[0].tokens
    assert tokens == greedy_reference(tiny_model_dir, tuple(PROMPT), 2)
