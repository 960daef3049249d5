"""Token-wise early exit through the target service: pruned nodes on the wire, output unchanged; the setting."""

from __future__ import annotations

import asyncio

import pytest

from services.settings import ServiceSettings, parse_early_exit
from shared.rpc.channel import aio_channel
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2, target_pb2_grpc
from tests.support.model_services import greedy_reference, serving

REJECTED = target_pb2.NODE_STATUS_REJECTED


def test_verify_reports_pruned_nodes_and_keeps_greedy_output(tiny_model_dir):
    prompt = [3, 14, 15, 92, 65]
    expected = greedy_reference(tiny_model_dir, tuple(prompt), 8)

    async def main():
        spec = "on:init_layer=0,k_init=1,k_final=1,gate=false"  # prune anything outside the top 1 after layer 0
        async with serving(tiny_model_dir, early_exit=spec) as (target, _), aio_channel(target.address) as channel:
            stub = target_pb2_grpc.TargetServiceStub(channel)
            item = common_pb2.PrefillItem(seq_id="a", prompt_ids=prompt, sampling=common_pb2.SamplingParams())
            reply = await stub.Prefill(target_pb2.TargetPrefillRequest(items=[item]))
            out = [reply.outputs[0].first_token]
            pruned = 0
            while len(out) < 8:
                wrong = [(t + 7) % 512 for t in expected[len(out) : len(out) + 3]]
                right = expected[len(out) : len(out) + 2]
                tree = common_pb2.TokenTree(token_ids=wrong + right, parent_ids=[-1, 0, 1, -1, 3][: len(wrong) + len(right)])
                reply = await stub.Verify(target_pb2.VerifyRequest(items=[target_pb2.VerifyItem(seq_id="a", tree=tree)]))
                (res,) = reply.outputs
                assert all(res.node_status[j] == REJECTED for j in res.pruned_nodes)
                pruned += len(res.pruned_nodes)
                out += list(res.tokens)
            assert out[:8] == expected
            assert pruned > 0

    asyncio.run(main())


def test_early_exit_setting():
    assert parse_early_exit(None) is None and parse_early_exit("off") is None
    config = parse_early_exit("on:k_init=16,gate=false")
    assert config.enabled and config.k_init == 16 and not config.gate
    assert ServiceSettings.from_env(env={"TANDEM_EARLY_EXIT": "on"}).early_exit_config().enabled
    with pytest.raises(ValueError):
        ServiceSettings.from_env(env={"TANDEM_EARLY_EXIT": "on:nope=1"})
