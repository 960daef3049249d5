"""DraftService over a real grpc.aio server: batched chain/tree speculation, bad input, Offload/Reload
(Nightjar elastic memory), and the same service running the model-free n-gram draft."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pydantic
import pytest

from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from shared.rpc.server import DRAFT_SERVICE
from tests.support.model_services import NUM_BLOCKS, greedy_reference, health_status, model_settings, serving


def prefill_item(seq_id: str, prompt: list[int]) -> common_pb2.PrefillItem:
    return common_pb2.PrefillItem(seq_id=seq_id, prompt_ids=prompt)


def test_speculate_chain_and_tree_in_one_call(tiny_model_dir):
    prompt = [3, 14, 15, 92, 65]
    expected = greedy_reference(tiny_model_dir, tuple(prompt), 6)

    async def main():
        # the draft serves the target's own weights: its greedy chain is the target's greedy output
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            assert await health_status(draft.address, DRAFT_SERVICE) == "SERVING"
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            reply = await stub.Prefill(
                draft_pb2.DraftPrefillRequest(items=[prefill_item("c", prompt), prefill_item("t", prompt)])
            )
            assert reply.costs[0].num_seqs == 2 and reply.timing.forward_ns > 0
            first = expected[0]  # what the target sampled at prefill
            reply = await stub.Speculate(
                draft_pb2.SpeculateRequest(
                    items=[
                        draft_pb2.SpecItem(seq_id="c", new_tokens=[first], chain=draft_pb2.ChainShape(length=4)),
                        draft_pb2.SpecItem(seq_id="t", new_tokens=[first], tree=draft_pb2.TreeShape(depth=3, width=2)),
                    ]
                )
            )
            chain, tree = reply.outputs
            assert chain.seq_id == "c" and list(chain.tree.token_ids) == expected[1:5]
            assert list(chain.tree.parent_ids) == [-1, 0, 1, 2] and len(chain.tree.draft_probs) == 4
            assert tree.seq_id == "t" and 3 <= len(tree.tree.token_ids) <= 6
            assert tree.tree.token_ids[0] == expected[1]  # the best beam starts with the greedy token
            # the batch drafts in lock-step: one forward per draft step, never one per request
            assert len(reply.costs) <= 4 and all(c.num_seqs <= 2 for c in reply.costs)
            assert reply.timing.forward_ns == sum(c.duration_ns for c in reply.costs)

            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.role, info.num_live_seqs, info.weights_offloaded) == ("draft", 2, False)
            released = await stub.Release(common_pb2.ReleaseRequest(seq_ids=["c", "t"]))
            assert released.num_released == 2 and released.kv_blocks_free == NUM_BLOCKS

    asyncio.run(main())


def test_bad_input(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            await stub.Prefill(draft_pb2.DraftPrefillRequest(items=[prefill_item("live", [1, 2, 3])]))
            before = await stub.Info(common_pb2.InfoRequest())
            P, S, item = draft_pb2.DraftPrefillRequest, draft_pb2.SpeculateRequest, draft_pb2.SpecItem
            cases = [
                ("unknown seq", stub.Speculate(S(items=[item(seq_id="ghost", new_tokens=[1])])), "NOT_FOUND", "ghost"),
                ("duplicate", stub.Prefill(P(items=[prefill_item("live", [1])])), "ALREADY_EXISTS", "already live"),
                ("empty prompt", stub.Prefill(P(items=[prefill_item("x", [])])), "INVALID_ARGUMENT", "empty prompt"),
                (
                    "OOV new token",
                    stub.Speculate(S(items=[item(seq_id="live", new_tokens=[512])])),
                    "INVALID_ARGUMENT",
                    "token id 512",
                ),
                (
                    "chain too long",
                    stub.Speculate(
                        S(items=[item(seq_id="live", new_tokens=[4], chain=draft_pb2.ChainShape(length=33))])
                    ),
                    "INVALID_ARGUMENT",
                    "chain length",
                ),
                (
                    "tree too deep",
                    stub.Speculate(
                        S(items=[item(seq_id="live", new_tokens=[4], tree=draft_pb2.TreeShape(depth=17, width=2))])
                    ),
                    "INVALID_ARGUMENT",
                    "tree depth",
                ),
                ("over context", stub.Prefill(P(items=[prefill_item("x", [1] * 1025)])), "OUT_OF_RANGE", "context"),
                (
                    "out of blocks",
                    stub.Prefill(P(items=[prefill_item("x", [1] * 300)])),
                    "RESOURCE_EXHAUSTED",
                    "blocks",
                ),
            ]
            for what, call, code, fragment in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == getattr(grpc.StatusCode, code), (what, err.value.details())
                assert fragment in err.value.details(), (what, err.value.details())
            after = await stub.Info(common_pb2.InfoRequest())
            assert (after.num_live_seqs, after.kv_blocks_free) == (before.num_live_seqs, before.kv_blocks_free)
            reply = await stub.Speculate(
                S(items=[item(seq_id="live", new_tokens=[4], chain=draft_pb2.ChainShape(length=2))])
            )
            assert len(reply.outputs[0].tree.token_ids) == 2  # still serving that sequence
            await stub.Release(common_pb2.ReleaseRequest(seq_ids=["live"]))
            assert (await stub.Info(common_pb2.InfoRequest())).kv_blocks_free == NUM_BLOCKS
            draft.engine_host.engine.runner.check_accounting()

    asyncio.run(main())


def test_offload_and_reload(tiny_model_dir):
    """Offload drops the draft's sequences and frees its KV pool; Prefill/Speculate are refused until Reload."""
    prompt = [3, 14, 15, 92, 65]
    expected = greedy_reference(tiny_model_dir, tuple(prompt), 4)

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            engine = draft.engine_host.engine
            await stub.Prefill(draft_pb2.DraftPrefillRequest(items=[prefill_item("a", prompt)]))
            offloaded = await stub.Offload(draft_pb2.OffloadRequest())
            assert offloaded.bytes_moved == 0  # CPU: the weights are already in host memory
            assert offloaded.kv_blocks_free == 0 and offloaded.timing.total_ns > 0
            assert engine.runner.cache.kv.numel() == 0  # the KV tensors are gone
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.weights_offloaded, info.num_live_seqs, info.kv_blocks_free) == (True, 0, 0)
            chain = draft_pb2.ChainShape(length=3)
            refused = [
                stub.Speculate(draft_pb2.SpeculateRequest(
                    items=[draft_pb2.SpecItem(seq_id="a", new_tokens=[expected[0]], chain=chain)])),
                stub.Prefill(draft_pb2.DraftPrefillRequest(items=[prefill_item("b", prompt)])),
            ]  # fmt: skip
            for call in refused:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "offloaded" in err.value.details() and "Reload" in err.value.details()
            # Release of what offload dropped is fine (idempotent), a second Offload is a no-op
            assert (await stub.Release(common_pb2.ReleaseRequest(seq_ids=["a"]))).num_released == 0
            assert (await stub.Offload(draft_pb2.OffloadRequest())).bytes_moved == 0

            reloaded = await stub.Reload(draft_pb2.ReloadRequest())
            assert reloaded.kv_blocks_free == NUM_BLOCKS
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.weights_offloaded, info.kv_blocks_free, info.kv_blocks_total) == (False, NUM_BLOCKS, NUM_BLOCKS)
            # the sequence was dropped: re-prefill (what the scheduler's resync does), then speculate as before
            await stub.Prefill(draft_pb2.DraftPrefillRequest(items=[prefill_item("a", prompt)]))
            reply = await stub.Speculate(draft_pb2.SpeculateRequest(
                items=[draft_pb2.SpecItem(seq_id="a", new_tokens=[expected[0]], chain=chain)]))  # fmt: skip
            assert list(reply.outputs[0].tree.token_ids) == expected[1:4]
            assert (await stub.Reload(draft_pb2.ReloadRequest())).bytes_moved == 0  # already resident
            await stub.Release(common_pb2.ReleaseRequest(seq_ids=["a"]))
            assert (await stub.Info(common_pb2.InfoRequest())).kv_blocks_free == NUM_BLOCKS
            engine.runner.check_accounting()  # no leaked blocks

    asyncio.run(main())


def test_ngram_draft_serves_prompt_lookup(tiny_model_dir):
    """TANDEM_MODEL=ngram:1-3: no model, no KV cache; drafts what followed the last n-gram earlier on."""
    #         0  1  2  3  4  5  6  7  8
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8]

    async def main():
        async with (
            serving(tiny_model_dir, "ngram:1-3", vocab_size=512) as (_, draft),
            aio_channel(draft.address) as channel,
        ):
            assert await health_status(draft.address, DRAFT_SERVICE) == "SERVING"
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.role, info.model_name, info.vocab_size, info.dtype, info.device) == (
                "draft", "ngram:1-3", 512, "none", "cpu"
            )  # fmt: skip
            assert (info.kv_blocks_total, info.kv_blocks_free, info.block_size, info.max_context) == (0, 0, 0, 0)
            reply = await stub.Prefill(
                draft_pb2.DraftPrefillRequest(items=[prefill_item("c", prompt), prefill_item("t", prompt)])
            )
            assert reply.costs[0].num_seqs == 2
            reply = await stub.Speculate(
                draft_pb2.SpeculateRequest(
                    items=[
                        # the target accepted 9: "7 8 9" matches positions 2-4, what followed is "5 6 7 8"
                        draft_pb2.SpecItem(seq_id="c", new_tokens=[9], chain=draft_pb2.ChainShape(length=4)),
                        draft_pb2.SpecItem(seq_id="t", new_tokens=[1], tree=draft_pb2.TreeShape(depth=2, width=2)),
                    ]
                )
            )
            chain, tree = reply.outputs
            assert list(chain.tree.token_ids) == [5, 6, 7, 8] and list(chain.tree.parent_ids) == [-1, 0, 1, 2]
            assert list(chain.tree.draft_probs) == [1.0] * 4
            assert list(tree.tree.token_ids) == []  # "... 8 1": nothing earlier to look up
            assert len(reply.costs) == 1 and reply.timing.forward_ns == reply.costs[0].duration_ns

            assert (await stub.Info(common_pb2.InfoRequest())).num_live_seqs == 2
            released = await stub.Release(common_pb2.ReleaseRequest(seq_ids=["c", "t", "never-seen"]))
            assert (released.num_released, released.kv_blocks_free) == (2, 0)
            assert (await stub.Info(common_pb2.InfoRequest())).num_live_seqs == 0

    asyncio.run(main())


def test_ngram_draft_bad_input_gets_a_status(tiny_model_dir):
    async def main():
        async with (
            serving(tiny_model_dir, "ngram", vocab_size=512) as (_, draft),
            aio_channel(draft.address) as channel,
        ):
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            await stub.Prefill(draft_pb2.DraftPrefillRequest(items=[prefill_item("live", [1, 2, 3, 1, 2])]))
            P, S, item = draft_pb2.DraftPrefillRequest, draft_pb2.SpeculateRequest, draft_pb2.SpecItem
            cases = [
                ("unknown seq", stub.Speculate(S(items=[item(seq_id="ghost", new_tokens=[1])])), "NOT_FOUND", "ghost"),
                ("duplicate", stub.Prefill(P(items=[prefill_item("live", [1])])), "ALREADY_EXISTS", "already live"),
                ("empty prompt", stub.Prefill(P(items=[prefill_item("x", [])])), "INVALID_ARGUMENT", "empty prompt"),
                ("OOV prompt", stub.Prefill(P(items=[prefill_item("x", [1, 512])])), "INVALID_ARGUMENT", "token id 512"),
                (
                    "OOV new token",
                    stub.Speculate(S(items=[item(seq_id="live", new_tokens=[1 << 20])])),
                    "INVALID_ARGUMENT",
                    "outside the vocabulary",
                ),
                (
                    "chain too long",
                    stub.Speculate(
                        S(items=[item(seq_id="live", new_tokens=[3], chain=draft_pb2.ChainShape(length=33))])
                    ),
                    "INVALID_ARGUMENT",
                    "chain length",
                ),
                ("offload", stub.Offload(draft_pb2.OffloadRequest()), "UNIMPLEMENTED", "no weights"),
                ("reload", stub.Reload(draft_pb2.ReloadRequest()), "UNIMPLEMENTED", "no weights"),
            ]
            for what, call, code, fragment in cases:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == getattr(grpc.StatusCode, code), (what, err.value.details())
                assert fragment in err.value.details(), (what, err.value.details())
            # nothing above touched the live sequence: "1 2" still finds "3 1 2" after it
            reply = await stub.Speculate(
                S(items=[item(seq_id="live", new_tokens=[3], chain=draft_pb2.ChainShape(length=2))])
            )
            assert list(reply.outputs[0].tree.token_ids) == [1, 2]
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.num_live_seqs, info.model_name) == (1, "ngram:1-4")

    asyncio.run(main())


@pytest.mark.parametrize("model", ["ngram:3-1", "ngram:x"])
def test_malformed_ngram_draft_fails_at_startup(model):
    with pytest.raises(pydantic.ValidationError, match="malformed n-gram draft"):
        model_settings(model)


def test_packed_chain_plans_draft_as_items_do_and_malformed_ones_get_a_status(tiny_model_dir):
    """Over SpeculateStream a plan's chains as columns (chain_packing.py) draft what StreamSpecItems draft; a plan
    whose columns disagree answers INVALID_ARGUMENT in band, and the stream and the sequences stay usable."""
    from shared.rpc.chain_packing import pack_chain_items
    from shared.rpc.packing import pack_i32, stream_prefill_to_pb, unpack_trees
    from shared.engine.types import PrefillItem, SpecItem

    prompt = [3, 14, 15, 92, 65]
    expected = greedy_reference(tiny_model_dir, tuple(prompt), 6)

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft), aio_channel(draft.address) as channel:
            call = draft_pb2_grpc.DraftServiceStub(channel).SpeculateStream()
            plans = [
                draft_pb2.DraftPlan(step=1, prefills=[stream_prefill_to_pb(PrefillItem(s, prompt)) for s in "ab"],
                                    chains=pack_chain_items([SpecItem("a", [expected[0]], chain_len=4)])),
                draft_pb2.DraftPlan(step=2, chains=draft_pb2.PackedChainItems(
                    seq_ids=["b"], num_new_tokens=pack_i32([3]), new_tokens=pack_i32([expected[0]]),
                    chain_lengths=pack_i32([4]))),
                draft_pb2.DraftPlan(step=3, items=[draft_pb2.StreamSpecItem(
                    seq_id="b", new_tokens=pack_i32([expected[0]]), chain=draft_pb2.ChainShape(length=4))]),
            ]  # fmt: skip
            outcomes = []
            for plan in plans:
                await call.write(plan)
                outcomes.append(await call.read())
            await call.done_writing()
            return outcomes

    packed, bad, items = asyncio.run(main())
    assert unpack_trees(packed.trees, 1)[0].token_ids == expected[1:5]
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "token counts" in bad.error.message
    assert unpack_trees(items.trees, 1)[0].token_ids == expected[1:5]  # "b" untouched by the refused plan
