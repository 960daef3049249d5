"""The whole request path over real gRPC, tiny models, real Redis (one stack for the module, see conftest).

Order matters only for speed: every test leaves the stack idle and healthy.
"""

from __future__ import annotations

import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sdk import Client, FinishReason
from sdk.errors import NotFoundError
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2, tandem_pb2_grpc
from shared.state.store import StateStore, StoreConfig
from tests.support.tiny_stack import MAX_CONTEXT, SPEC_K, VOCAB

SPECS = ["off", 2, SPEC_K, "auto", 5, "off"]


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 40))] for _ in range(n)]


def _generate_all(address: str, prompts, lengths, specs) -> list:
    with Client(address, timeout=120) as client, ThreadPoolExecutor(len(prompts)) as pool:
        futures = [
            pool.submit(client.generate, p, max_new_tokens=n, speculation=s) for p, n, s in zip(prompts, lengths, specs)
        ]
        return [f.result() for f in futures]


def _live_seqs(stack) -> tuple[int, int]:
    target = stack.loop.run(stack.scheduler.servicer.target_info())
    draft = stack.loop.run(stack.scheduler.servicer.draft_info())
    return target.num_live_seqs, draft.num_live_seqs


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def test_mixed_concurrent_batch_is_lossless_and_recorded(stack, reference):
    prompts = _prompts(12, seed=1)
    lengths = [8 + 3 * i for i in range(12)]
    specs = [SPECS[i % len(SPECS)] for i in range(12)]
    results = _generate_all(stack.address, prompts, lengths, specs)
    for i, (p, n, r) in enumerate(zip(prompts, lengths, results)):
        assert r.token_ids == reference.greedy(p, n), f"request {i} (speculation {specs[i]})"
        assert r.finish_reason == FinishReason.LENGTH
    speculated = [r for r, s in zip(results, specs) if s != "off"]
    assert all(r.stats.num_draft_tokens > 0 for r in speculated)
    assert all(r.stats.num_draft_tokens == 0 for r, s in zip(results, specs) if s == "off")
    _wait(lambda: _live_seqs(stack) == (0, 0))  # every KV block came back on both services

    # Redis: a record and the tokens of every request, acceptance statistics per scope
    stack.loop.run(stack.scheduler.recorder.flush())
    with StateStore(StoreConfig(url=stack.redis_url)) as store:
        for r in results:
            record = store.get_request(r.request_id)
            assert record is not None and record.state == "finished" and record.finish_reason == "length"
            assert store.get_tokens(r.request_id) == r.token_ids
            assert record.num_generated == len(r.token_ids) and record.prompt_len == r.num_prompt_tokens
            assert store.acceptance("request", r.request_id).num_accepted == r.stats.num_accepted_tokens
        assert store.acceptance("global").num_proposed >= sum(r.stats.num_draft_tokens for r in results)
        assert store.acceptance("policy", "client_fixed").num_steps > 0
        assert store.acceptance("policy", "fixed_chain").num_steps > 0  # the AUTO requests

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{stack.scheduler.metrics_port}/metrics", timeout=5).read()
    assert b"tandem_ttft_seconds_count" in metrics and b"tandem_draft_tokens_proposed_total" in metrics


def test_stream_delivers_every_token_once_in_order(stack, reference):
    prompt = _prompts(1, seed=2)[0]
    with Client(stack.address, timeout=120) as client, client.stream(prompt, max_new_tokens=48, speculation=4) as s:
        events = list(s)
    tokens = [t for ev in events for t in ev.token_ids]
    assert tokens == reference.greedy(prompt, 48) == s.result.token_ids
    stamps = [t for ev in events for t in ev.timestamps_unix_ns]
    assert len(stamps) == 48 and stamps == sorted(stamps)
    assert sum(ev.num_accepted for ev in events) == s.result.stats.num_accepted_tokens
    assert s.result.ttft_ms > 0 and s.result.tpot_ms > 0


def test_one_trace_covers_scheduler_draft_and_target(stack):
    for running in (stack.scheduler, stack.target, stack.draft):
        running.tracer_provider.memory_exporter.clear()
    with Client(stack.address, timeout=60) as client:
        result = client.generate([5, 6, 7, 8], max_new_tokens=10, speculation=2)

    def request_spans():
        return [
            s
            for s in stack.scheduler.tracer_provider.memory_exporter.get_finished_spans()
            if s.name == "request" and s.attributes["tandem.request_id"] == result.request_id
        ]

    _wait(request_spans)  # the request span ends after the step that finished it, just after the reply
    (request,) = request_spans()
    trace_id = request.context.trace_id
    names = {}
    for running in (stack.scheduler, stack.target, stack.draft):
        spans = [
            s for s in running.tracer_provider.memory_exporter.get_finished_spans() if s.context.trace_id == trace_id
        ]
        names[running.role] = {s.name for s in spans}
        assert all(s.attributes["service.name"] == running.role for s in spans)
    assert {"request", "queue", "prefill", "speculate", "verify", "commit"} <= names["scheduler"]
    assert {"tandem.v1.TargetService/Prefill", "tandem.v1.TargetService/Verify"} <= names["target"]
    assert {"tandem.v1.DraftService/Prefill", "tandem.v1.DraftService/Speculate"} <= names["draft"]


def _ids(*ids: int) -> tandem_pb2.TokenIds:
    return tandem_pb2.TokenIds(ids=list(ids))


@pytest.mark.parametrize(
    ("msg", "code"),
    [
        (tandem_pb2.GenerateRequest(token_ids=_ids(), max_new_tokens=4), "INVALID_ARGUMENT"),
        (tandem_pb2.GenerateRequest(token_ids=_ids(1, VOCAB + 3), max_new_tokens=4), "INVALID_ARGUMENT"),
        (tandem_pb2.GenerateRequest(token_ids=_ids(*[7] * MAX_CONTEXT), max_new_tokens=8), "OUT_OF_RANGE"),
        (tandem_pb2.GenerateRequest(text="hello", max_new_tokens=4), "FAILED_PRECONDITION"),
        (  # a conversation needs the tokenizer's chat template; the tiny models have no tokenizer at all
            tandem_pb2.GenerateRequest(chat=tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(role="user",
                                       content="hi")]), max_new_tokens=4),
            "FAILED_PRECONDITION",
        ),  # fmt: skip
        (tandem_pb2.GenerateRequest(chat=tandem_pb2.ChatMessages(), max_new_tokens=4), "INVALID_ARGUMENT"),
        (
            tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, slo=tandem_pb2.Slo(tpot_ms=-1)),
            "INVALID_ARGUMENT",
        ),
        (
            tandem_pb2.GenerateRequest(
                token_ids=_ids(1), max_new_tokens=4, sampling=common_pb2.SamplingParams(temperature=-0.5)
            ),
            "INVALID_ARGUMENT",
        ),
        (
            tandem_pb2.GenerateRequest(
                token_ids=_ids(1), max_new_tokens=4, sampling=common_pb2.SamplingParams(top_p=2.0)
            ),
            "INVALID_ARGUMENT",
        ),
    ],
    ids=["empty", "out-of-vocab", "oversized", "text-no-tokenizer", "chat-no-tokenizer", "chat-empty", "bad-slo",
         "bad-temperature", "bad-top-p"],
)
def test_bad_input_gets_its_status_and_leaks_nothing(stack, msg, code):
    with grpc.insecure_channel(stack.address) as channel, pytest.raises(grpc.RpcError) as info:
        tandem_pb2_grpc.TandemStub(channel).GenerateUnary(msg, timeout=30)
    assert info.value.code().name == code and info.value.details()
    assert _live_seqs(stack) == (0, 0)


def test_abort_unknown_id_is_not_found(stack):
    with Client(stack.address) as client, pytest.raises(NotFoundError):
        client.abort("no-such-request")


def test_killing_the_draft_loses_nothing_and_speculation_resumes(stack, reference):
    prompts = _prompts(6, seed=3)
    lengths = [160] * 6
    with Client(stack.address, timeout=180) as client, ThreadPoolExecutor(6) as pool:
        streams = [client.stream(p, max_new_tokens=n, speculation=SPEC_K) for p, n in zip(prompts, lengths)]
        iterators = [iter(s) for s in streams]
        for it in iterators:
            next(it)  # every request is running
        stack.loop.run(stack.draft.stop(0))
        _wait(lambda: not stack.scheduler.scheduler.draft_available, timeout=20)
        futures = [pool.submit(list, it) for it in iterators]
        time.sleep(0.5)  # a few plain-decoding steps while the draft is gone
        stack.restart_draft()
        for f in futures:
            f.result(timeout=180)
    for s, p, n in zip(streams, prompts, lengths):
        assert s.result.finish_reason == FinishReason.LENGTH
        assert s.result.token_ids == reference.greedy(p, n)
    # the draft is back: a new request speculates again
    # "available" is the loop's optimism after a backoff (the next sync checks): a call that still finds the
    # restarted draft starting doubles the backoff, so a request may decode plainly; the next ones speculate
    again = []

    def speculates() -> bool:
        with Client(stack.address, timeout=120) as client:
            again.append(client.generate(prompts[0][:5], max_new_tokens=24, speculation=SPEC_K))
        return again[-1].stats.num_draft_tokens > 0

    _wait(speculates, timeout=90)
    assert again[-1].token_ids == reference.greedy(prompts[0][:5], 24)
    _wait(lambda: _live_seqs(stack) == (0, 0))
