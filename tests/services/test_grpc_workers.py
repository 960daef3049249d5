"""The scheduler's gRPC workers against real services: lossless greedy speculation, errors, one trace."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from services.scheduler.grpc_workers import GrpcDraftWorker, GrpcTargetWorker, WorkerRpcError
from shared.engine.types import PrefillItem, SpecItem, VerifyItem
from shared.telemetry import setup_tracing
from tests.support.model_services import NUM_BLOCKS, free_port, greedy_reference, serving

PROMPTS = [[3, 14, 15, 92, 65], [35, 89], [79, 32, 38, 46, 26, 43, 38]]
NUM_TOKENS = 12


async def speculative_greedy(
    target: GrpcTargetWorker, draft: GrpcDraftWorker, shape: dict
) -> tuple[list[list[int]], int]:
    """The loop the scheduler runs, by hand: per iteration ONE speculate and ONE verify for the whole batch.

    Returns the outputs and the number of drafted tokens the target accepted."""
    ids = [f"s{i}" for i in range(len(PROMPTS))]
    items = [PrefillItem(s, p) for s, p in zip(ids, PROMPTS)]
    firsts, _ = await asyncio.gather(target.prefill(items), draft.prefill(items))
    outputs = [[r.first_token] for r in firsts]
    new_tokens = [list(o) for o in outputs]
    accepted = 0
    while min(len(o) for o in outputs) < NUM_TOKENS:
        trees = await draft.speculate([SpecItem(s, n, **shape) for s, n in zip(ids, new_tokens)])
        results = await target.verify([VerifyItem(s, t) for s, t in zip(ids, trees)])
        for out, res in zip(outputs, results):
            out.extend(res.tokens)
            accepted += res.num_accepted
        new_tokens = [res.tokens for res in results]
    await asyncio.gather(target.release(ids), draft.release(ids))
    return [o[:NUM_TOKENS] for o in outputs], accepted


@pytest.mark.parametrize("shape", [{"chain_len": 3}, {"tree_depth": 3, "tree_width": 2}], ids=["chain3", "tree3x2"])
@pytest.mark.parametrize("agreeing", [True, False], ids=["same-weights-draft", "random-draft"])
def test_greedy_speculation_over_grpc_equals_target_only_greedy(tiny_model_dir, draft_model_dir, shape, agreeing):
    draft_dir = tiny_model_dir if agreeing else draft_model_dir
    expected = [greedy_reference(tiny_model_dir, tuple(p), NUM_TOKENS) for p in PROMPTS]

    async def main():
        async with serving(tiny_model_dir, draft_dir) as (t, d):
            target, draft = GrpcTargetWorker(t.address), GrpcDraftWorker(d.address)
            try:
                out, accepted = await speculative_greedy(target, draft, shape)
                infos = await asyncio.gather(target.info(), draft.info())
            finally:
                await asyncio.gather(target.close(), draft.close())
            return out, accepted, infos

    out, accepted, infos = asyncio.run(main())
    assert out == expected
    if agreeing:  # the same weights draft exactly what the target decodes
        assert accepted >= (NUM_TOKENS - 1) // 2 * len(PROMPTS)
    for info in infos:
        assert (info.kv_blocks_free, info.num_live_seqs) == (NUM_BLOCKS, 0)


def test_rpc_errors_carry_the_status_for_the_scheduler(tiny_model_dir):
    async def main():
        async with serving(tiny_model_dir) as (t, _):
            target = GrpcTargetWorker(t.address, timeout_s=5)
            with pytest.raises(WorkerRpcError) as err:
                await target.verify([VerifyItem("ghost")])
            await target.release(["ghost"])  # idempotent: no error
            await target.close()
        assert isinstance(err.value, grpc.aio.AioRpcError) and err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.grpc_code == "NOT_FOUND"
        assert str(err.value) == "target Verify: NOT_FOUND: unknown sequence 'ghost'"

        draft = GrpcDraftWorker(f"127.0.0.1:{free_port()}", timeout_s=5)
        with pytest.raises(WorkerRpcError) as err:
            await draft.prefill([PrefillItem("a", [1])])
        await draft.close()
        assert err.value.grpc_code == "UNAVAILABLE"  # fails fast: the scheduler degrades at once

    asyncio.run(main())


def test_client_span_and_server_spans_share_one_trace(tiny_model_dir):
    client = setup_tracing("scheduler", exporter="memory")
    tracer = client.get_tracer("test")

    async def main():
        async with serving(tiny_model_dir, tiny_model_dir, trace_exporter="memory") as (t, d):
            target, draft = GrpcTargetWorker(t.address), GrpcDraftWorker(d.address)
            with tracer.start_as_current_span("request") as root:
                with tracer.start_as_current_span("prefill"):
                    first = (await target.prefill([PrefillItem("a", [1, 2, 3])]))[0].first_token
                    await draft.prefill([PrefillItem("a", [1, 2, 3])])
                with tracer.start_as_current_span("speculate"):
                    (tree,) = await draft.speculate([SpecItem("a", [first], chain_len=3)])
                with tracer.start_as_current_span("verify") as verify:
                    (result,) = await target.verify([VerifyItem("a", tree)])
            await asyncio.gather(target.release(["a"]), draft.release(["a"]))
            await asyncio.gather(target.close(), draft.close())
            spans = [*t.tracer_provider.memory_exporter.get_finished_spans()]
            spans += d.tracer_provider.memory_exporter.get_finished_spans()
            return root, verify, result, spans

    root, verify, result, spans = asyncio.run(main())
    by_name = {s.name: s for s in spans if s.name.endswith(("Prefill", "Speculate", "Verify"))}
    assert set(by_name) == {
        "tandem.v1.TargetService/Prefill",
        "tandem.v1.DraftService/Prefill",
        "tandem.v1.DraftService/Speculate",
        "tandem.v1.TargetService/Verify",
    }
    trace_id = root.get_span_context().trace_id
    assert {s.context.trace_id for s in by_name.values()} == {trace_id}
    server_verify = by_name["tandem.v1.TargetService/Verify"]
    assert server_verify.parent.span_id == verify.get_span_context().span_id
    assert server_verify.attributes["service.name"] == "target"
    assert server_verify.attributes["tandem.batch_size"] == 1
    assert tuple(server_verify.attributes["tandem.tree_nodes"]) == (3,)
    assert tuple(server_verify.attributes["tandem.accepted_lens"]) == (result.num_accepted,) == (3,)
    speculate = by_name["tandem.v1.DraftService/Speculate"]
    assert tuple(speculate.attributes["tandem.chain_lens"]) == (3,)
    assert tuple(speculate.attributes["tandem.drafted_tokens"]) == (3,)
    assert speculate.attributes["service.name"] == "draft"
