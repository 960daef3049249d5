"""The scheduler's draft worker over its step stream, against a real draft service: what it defers and when
it goes. A release goes alone after IDLE_FLUSH_S when no plan follows, without the prefills queued beside it
(they ride on their request's plan); closing the worker sends the last releases."""

from __future__ import annotations

import asyncio

from services.scheduler.stream_workers import IDLE_FLUSH_S, StreamDraftWorker
from shared.engine.types import PrefillItem, SpecItem
from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2_grpc
from tests.support.model_services import serving


def test_idle_releases_go_alone_and_the_last_ones_at_close(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            live = lambda: stub.Info(common_pb2.InfoRequest())  # noqa: E731
            worker = StreamDraftWorker(draft.address)
            await worker.prefill([PrefillItem("a", [3, 14, 15])])
            await worker.speculate([SpecItem("a", [92], chain_len=2)])  # the prefill rode on this plan
            assert (await live()).num_live_seqs == 1
            await worker.prefill([PrefillItem("b", [5, 6, 7])])  # queued for b's first plan
            await worker.release(["a"])
            await asyncio.sleep(4 * IDLE_FLUSH_S)
            assert (await live()).num_live_seqs == 0  # a's release went alone; b's prefill still waits
            trees = await worker.speculate([SpecItem("b", [8], chain_len=2)])
            assert len(trees) == 1 and len(trees[0]) == 2 and (await live()).num_live_seqs == 1
            await worker.release(["b"])
            await worker.close()  # within IDLE_FLUSH_S: the close sends it
            return (await live()).num_live_seqs

    assert asyncio.run(main()) == 0


def test_a_release_queued_for_a_sequence_the_plan_speculates_goes_after_it(tiny_model_dir):
    """A plan applies its releases first: a release queued for a sequence the same plan speculates (a request
    preempted while its next speculate was sent ahead, scheduler/draft_ahead.py) rides on the next plan."""

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            live = lambda: stub.Info(common_pb2.InfoRequest())  # noqa: E731
            worker = StreamDraftWorker(draft.address)
            await worker.prefill([PrefillItem("a", [3, 14, 15]), PrefillItem("b", [5, 6, 7])])
            await worker.speculate([SpecItem("a", [92], chain_len=2), SpecItem("b", [8], chain_len=2)])
            await worker.release(["a", "b"])
            trees = await worker.speculate([SpecItem("a", [1], chain_len=2)])  # not NOT_FOUND: a's release waits
            assert len(trees) == 1 and len(trees[0]) == 2
            assert (await live()).num_live_seqs == 1  # b's release went with the plan, a's is queued
            await asyncio.sleep(4 * IDLE_FLUSH_S)
            assert (await live()).num_live_seqs == 0  # and goes alone after IDLE_FLUSH_S
            await worker.close()

    asyncio.run(main())


def test_a_resync_release_goes_before_the_prefill_of_the_same_id(tiny_model_dir):
    """A release followed by a prefill of the same id (a resync, draft_link.py) rides on the plan that speculates it:
    the draft applies releases before prefills, so the fresh copy is what the plan speculates on."""

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            worker = StreamDraftWorker(draft.address)
            await worker.prefill([PrefillItem("a", [3, 14, 15])])
            await worker.speculate([SpecItem("a", [92], chain_len=2)])
            await worker.release(["a"])
            await worker.prefill([PrefillItem("a", [3, 14, 15, 92])])
            trees = await worker.speculate([SpecItem("a", [6], chain_len=2)])  # not ALREADY_EXISTS
            assert len(trees) == 1 and len(trees[0]) == 2
            assert (await stub.Info(common_pb2.InfoRequest())).num_live_seqs == 1
            await worker.close()

    asyncio.run(main())
