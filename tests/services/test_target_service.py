"""TargetService over a real grpc.aio server: health, Info, batched prefill/verify/step, timings, bad input."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2, target_pb2_grpc
from shared.rpc.server import TARGET_SERVICE
from tests.support.model_services import NUM_BLOCKS, greedy_reference, health_status, serving

ACCEPTED, REJECTED = target_pb2.NODE_STATUS_ACCEPTED, target_pb2.NODE_STATUS_REJECTED


def prefill_item(seq_id: str, prompt: list[int], **sampling) -> common_pb2.PrefillItem:
    return common_pb2.PrefillItem(seq_id=seq_id, prompt_ids=prompt, sampling=common_pb2.SamplingParams(**sampling))


def chain(tokens: list[int]) -> common_pb2.TokenTree:
    return common_pb2.TokenTree(token_ids=tokens, parent_ids=list(range(-1, len(tokens) - 1)))


def test_prefill_verify_step_release_with_timings_and_info(tiny_model_dir):
    prompts = {"a": [3, 14, 15, 92, 65], "b": [35, 89]}
    expected = {k: greedy_reference(tiny_model_dir, tuple(p), 6) for k, p in prompts.items()}

    async def main():
        async with serving(tiny_model_dir) as (target, _), aio_channel(target.address) as channel:
            assert await health_status(target.address) == "SERVING"
            assert await health_status(target.address, TARGET_SERVICE) == "SERVING"
            stub = target_pb2_grpc.TargetServiceStub(channel)
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.role, info.vocab_size, info.max_context, info.dtype, info.device) == (
                "target", 512, 1024, "float32", "cpu"
            )  # fmt: skip
            assert info.kv_blocks_total == info.kv_blocks_free == NUM_BLOCKS and info.block_size == 4
            assert info.model_name == "tiny-llama" and info.service_version and not info.weights_offloaded

            reply = await stub.Prefill(
                target_pb2.TargetPrefillRequest(items=[prefill_item(k, p) for k, p in prompts.items()])
            )
            assert [(o.seq_id, o.first_token) for o in reply.outputs] == [(k, expected[k][0]) for k in prompts]
            (cost,) = reply.costs
            assert (cost.num_seqs, cost.num_batched_tokens) == (2, 7) and cost.duration_ns > 0
            t = reply.timing
            assert t.total_ns >= t.forward_ns == cost.duration_ns > 0 and t.start_unix_ns > 0

            # a right chain for "a" (all accepted + bonus), a wrong first token for "b" (bonus only)
            wrong = (expected["b"][1] + 1) % 512
            reply = await stub.Verify(
                target_pb2.VerifyRequest(
                    items=[
                        target_pb2.VerifyItem(seq_id="a", tree=chain(expected["a"][1:4])),
                        target_pb2.VerifyItem(seq_id="b", tree=chain([wrong, 7])),
                    ]
                )
            )
            a, b = reply.outputs
            assert list(a.tokens) == expected["a"][1:5] and list(a.accepted_nodes) == [0, 1, 2]
            assert list(a.node_status) == [ACCEPTED] * 3
            assert list(b.tokens) == expected["b"][1:2] and list(b.accepted_nodes) == []
            assert list(b.node_status) == [REJECTED, target_pb2.NODE_STATUS_UNREACHED]
            assert reply.costs[0].num_batched_tokens == 2 + 3 + 2  # two roots (bonus tokens) + 5 nodes

            # Step: a new prefill and a plain decode in one forward
            reply = await stub.Step(
                target_pb2.StepRequest(
                    prefills=[prefill_item("c", prompts["a"])], verifies=[target_pb2.VerifyItem(seq_id="b")]
                )
            )
            assert reply.prefills[0].first_token == expected["a"][0]
            assert list(reply.verifies[0].tokens) == expected["b"][2:3]
            assert len(reply.costs) == 1 and reply.costs[0].num_seqs == 2

            info = await stub.Info(common_pb2.InfoRequest())
            assert info.num_live_seqs == 3 and info.kv_blocks_free < NUM_BLOCKS
            released = await stub.Release(common_pb2.ReleaseRequest(seq_ids=["a", "b", "c", "a", "ghost"]))
            assert released.num_released == 3 and released.kv_blocks_free == NUM_BLOCKS
            info = await stub.Info(common_pb2.InfoRequest())
            assert info.num_live_seqs == 0 and info.kv_blocks_free == NUM_BLOCKS
            target.engine_host.engine.runner.check_accounting()

    asyncio.run(main())


LONG = [(7 * i) % 512 for i in range(1020)]  # 1020 prompt + 1 first token: 3 short of the 1024 window


def _bad_target_calls(stub: target_pb2_grpc.TargetServiceStub):
    """(what, call, expected code, message fragment); "live" holds LONG (255 of 300 blocks)."""
    V = target_pb2.VerifyRequest
    P = target_pb2.TargetPrefillRequest
    vi = target_pb2.VerifyItem
    return [
        ("unknown seq", stub.Verify(V(items=[vi(seq_id="ghost")])), "NOT_FOUND", "unknown sequence 'ghost'"),
        ("duplicate", stub.Prefill(P(items=[prefill_item("live", [1])])), "ALREADY_EXISTS", "already live"),
        ("twice in a batch", stub.Prefill(P(items=[prefill_item("x", [1])] * 2)), "INVALID_ARGUMENT", "twice"),
        ("empty prompt", stub.Prefill(P(items=[prefill_item("x", [])])), "INVALID_ARGUMENT", "empty prompt"),
        ("OOV prompt", stub.Prefill(P(items=[prefill_item("x", [5, 512])])), "INVALID_ARGUMENT", "token id 512"),
        ("negative token", stub.Prefill(P(items=[prefill_item("x", [-1])])), "INVALID_ARGUMENT", "token id -1"),
        (
            "bad temperature",
            stub.Prefill(P(items=[prefill_item("x", [1], temperature=-1)])),
            "INVALID_ARGUMENT",
            "temperature",
        ),
        (
            "over-context prompt after a good one",
            stub.Prefill(P(items=[prefill_item("x", [1, 2]), prefill_item("y", LONG + [1] * 5)])),
            "OUT_OF_RANGE",
            "context window",
        ),
        ("out of blocks", stub.Prefill(P(items=[prefill_item("x", [3] * 200)])), "RESOURCE_EXHAUSTED", "KV blocks"),
        (
            "over-context tree",
            stub.Verify(V(items=[vi(seq_id="live", tree=chain([1, 2, 3, 4]))])),
            "OUT_OF_RANGE",
            "context window",
        ),
        (
            "forward parent",
            stub.Verify(V(items=[vi(seq_id="live", tree=common_pb2.TokenTree(token_ids=[1, 2], parent_ids=[1, -1]))])),
            "INVALID_ARGUMENT",
            "parent",
        ),
        (
            "parents missing",
            stub.Verify(V(items=[vi(seq_id="live", tree=common_pb2.TokenTree(token_ids=[1, 2], parent_ids=[-1]))])),
            "INVALID_ARGUMENT",
            "parent_ids",
        ),
        ("OOV tree token", stub.Verify(V(items=[vi(seq_id="live", tree=chain([600]))])), "INVALID_ARGUMENT", "600"),
        (
            "child dist row outside the tree",
            stub.Verify(
                V(
                    items=[
                        vi(
                            seq_id="live",
                            tree=common_pb2.TokenTree(
                                token_ids=[1],
                                parent_ids=[-1],
                                child_dists=[common_pb2.ChildDist(row=5, token_ids=[1], probs=[1.0])],
                            ),
                        )
                    ]
                )
            ),
            "INVALID_ARGUMENT",
            "row 5",
        ),
        ("empty batch", stub.Verify(V()), "INVALID_ARGUMENT", "empty batch"),
    ]


def test_bad_input_gets_a_status_and_leaves_the_engine_untouched(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir, num_blocks=300) as (target, _), aio_channel(target.address) as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            first = await stub.Prefill(target_pb2.TargetPrefillRequest(items=[prefill_item("live", LONG)]))
            before = await stub.Info(common_pb2.InfoRequest())
            for what, call, code, fragment in _bad_target_calls(stub):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code().name == code, (what, err.value.details())
                assert fragment in err.value.details(), (what, err.value.details())
            # nothing leaked, nothing moved: "live" continues exactly as the reference does
            after = await stub.Info(common_pb2.InfoRequest())
            assert (
                (after.num_live_seqs, after.kv_blocks_free) == (before.num_live_seqs, before.kv_blocks_free) == (1, 45)
            )
            reply = await stub.Verify(target_pb2.VerifyRequest(items=[target_pb2.VerifyItem(seq_id="live")]))
            assert [first.outputs[0].first_token, *reply.outputs[0].tokens] == greedy_reference(
                tiny_model_dir, tuple(LONG), 2
            )
            await stub.Release(common_pb2.ReleaseRequest(seq_ids=["live"]))
            assert (await stub.Info(common_pb2.InfoRequest())).kv_blocks_free == 300
            assert await health_status(target.address, TARGET_SERVICE) == "SERVING"
            target.engine_host.engine.runner.check_accounting()

    asyncio.run(main())


def test_resize_kv_grows_and_shrinks_the_pool_with_status_errors(tiny_model_dir):
    """ResizeKV (elastic memory): Info reports the range; a live sequence keeps decoding across a grow; bad sizes
    are OUT_OF_RANGE and a shrink over owned blocks FAILED_PRECONDITION, the pool unchanged."""
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32]
    expected = greedy_reference(tiny_model_dir, tuple(prompt), 12)

    async def main():
        async with serving(tiny_model_dir, num_blocks=4, kv_grow_blocks=6) as (target, _), aio_channel(
            target.address
        ) as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            info = await stub.Info(common_pb2.InfoRequest())
            assert (info.kv_blocks_total, info.kv_blocks_base, info.kv_blocks_max) == (4, 4, 10)
            prefilled = await stub.Prefill(target_pb2.TargetPrefillRequest(items=[prefill_item("a", prompt)]))
            out = [prefilled.outputs[0].first_token]
            verify = target_pb2.VerifyRequest(items=[target_pb2.VerifyItem(seq_id="a")])
            with pytest.raises(grpc.aio.AioRpcError) as err:  # 9 + 8 tokens do not fit 4 blocks of 4
                for _ in range(11):
                    out += (await stub.Verify(verify)).outputs[0].tokens
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            grown = await stub.ResizeKV(target_pb2.ResizeKVRequest(num_blocks=10))
            assert (grown.kv_blocks_total, grown.timing.total_ns > 0) == (10, True)
            while len(out) < 12:
                out += (await stub.Verify(verify)).outputs[0].tokens
            assert out[:12] == expected

            for size, code in ((0, "OUT_OF_RANGE"), (3, "OUT_OF_RANGE"), (11, "OUT_OF_RANGE"), (4, "FAILED_PRECONDITION")):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ResizeKV(target_pb2.ResizeKVRequest(num_blocks=size))
                assert err.value.code().name == code, size
            assert "owned by live sequences (a)" in err.value.details()
            info = await stub.Info(common_pb2.InfoRequest())
            assert info.kv_blocks_total == 10 and info.num_live_seqs == 1
            await stub.Release(common_pb2.ReleaseRequest(seq_ids=["a"]))
            shrunk = await stub.ResizeKV(target_pb2.ResizeKVRequest(num_blocks=4))
            assert (shrunk.kv_blocks_total, shrunk.kv_blocks_free) == (4, 4)
            assert shrunk.kv_bytes * 10 == grown.kv_bytes * 4 > 0

    asyncio.run(main())
