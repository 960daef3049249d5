"""The public Tandem servicer over fake workers: lossless output, streaming, statuses, aborts, Info."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from sdk import Client, FinishReason
from sdk.errors import NotFoundError
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2, tandem_pb2_grpc
from tests.support.fake_stack import CHARS, EOS, MAX_CONTEXT, VOCAB

SPECS = ["off", 1, 3, "auto"]


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))] for _ in range(n)]


def test_concurrent_greedy_equals_target_alone(token_stack):
    prompts = _prompts(12)
    with Client(token_stack.address, timeout=30) as client, ThreadPoolExecutor(12) as pool:
        futures = [
            pool.submit(client.generate, p, max_new_tokens=5 + 3 * i, speculation=SPECS[i % len(SPECS)])
            for i, p in enumerate(prompts)
        ]
        results = [f.result() for f in futures]
    for i, (prompt, result) in enumerate(zip(prompts, results)):
        assert result.token_ids == token_stack.lm.generate(prompt, 5 + 3 * i), f"request {i}"
        assert result.finish_reason == FinishReason.LENGTH
        assert len(result.token_timestamps_unix_ns) == len(result.token_ids)
    off, fixed = results[0], results[2]
    assert off.stats.num_draft_tokens == 0 and off.stats.mean_accepted_length == pytest.approx(1.0)
    assert fixed.stats.num_draft_tokens > 0 and fixed.stats.num_steps > 0
    assert not token_stack.draft.mismatches
    _wait(lambda: token_stack.target.seqs == {} and token_stack.draft.seqs == {})  # everything released


def test_stream_delivers_each_token_once_in_order(token_stack):
    prompt = _prompts(1, seed=7)[0]
    with Client(token_stack.address, timeout=30) as client:
        with client.stream(prompt, max_new_tokens=40, speculation=3) as stream:
            events = list(stream)
        result = stream.result
    tokens = [t for ev in events for t in ev.token_ids]
    assert tokens == token_stack.lm.generate(prompt, 40) == result.token_ids
    stamps = [s for ev in events for s in ev.timestamps_unix_ns]
    assert len(stamps) == 40 and stamps == sorted(stamps)
    assert sum(ev.num_accepted for ev in events) == result.stats.num_accepted_tokens
    assert all(ev.num_accepted < len(ev.token_ids) for ev in events)  # every chunk ends in a target token
    assert result.stats.num_steps == len(events) - 1  # one chunk per verify step, plus prefill's
    assert result.num_prompt_tokens == len(prompt) and result.ttft_ms > 0


def _raw_stub(address: str) -> tuple[grpc.Channel, tandem_pb2_grpc.TandemStub]:
    channel = grpc.insecure_channel(address)
    return channel, tandem_pb2_grpc.TandemStub(channel)


def _ids(*ids: int) -> tandem_pb2.TokenIds:
    return tandem_pb2.TokenIds(ids=list(ids))


BAD_REQUESTS = {
    "no prompt": (tandem_pb2.GenerateRequest(max_new_tokens=4), "INVALID_ARGUMENT", "prompt is required"),
    "empty ids": (tandem_pb2.GenerateRequest(token_ids=_ids(), max_new_tokens=4), "INVALID_ARGUMENT", "empty"),
    "empty text": (tandem_pb2.GenerateRequest(text="", max_new_tokens=4), "INVALID_ARGUMENT", "empty"),
    "text, no tokenizer": (
        tandem_pb2.GenerateRequest(text="hello", max_new_tokens=4),
        "FAILED_PRECONDITION",
        "no tokenizer",
    ),
    "stop, no tokenizer": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, stop=["x"]),
        "FAILED_PRECONDITION",
        "stop strings",
    ),
    "id out of vocab": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1, VOCAB), max_new_tokens=4),
        "INVALID_ARGUMENT",
        "vocabulary",
    ),
    "oversized": (
        tandem_pb2.GenerateRequest(token_ids=_ids(*[1] * MAX_CONTEXT), max_new_tokens=1),
        "OUT_OF_RANGE",
        "context window",
    ),
    "max_new_tokens 0": (tandem_pb2.GenerateRequest(token_ids=_ids(1)), "INVALID_ARGUMENT", "max_new_tokens"),
    "negative temperature": (
        tandem_pb2.GenerateRequest(
            token_ids=_ids(1), max_new_tokens=4, sampling=common_pb2.SamplingParams(temperature=-1)
        ),
        "INVALID_ARGUMENT",
        "temperature",
    ),
    "top_p 0": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, sampling=common_pb2.SamplingParams(top_p=0)),
        "INVALID_ARGUMENT",
        "top_p",
    ),
    "negative tpot": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, slo=tandem_pb2.Slo(tpot_ms=-5)),
        "INVALID_ARGUMENT",
        "tpot_ms",
    ),
    "nan tpot": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, slo=tandem_pb2.Slo(tpot_ms=float("nan"))),
        "INVALID_ARGUMENT",
        "tpot_ms",
    ),
    "zero ttft": (
        tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, slo=tandem_pb2.Slo(tpot_ms=50, ttft_ms=0)),
        "INVALID_ARGUMENT",
        "ttft_ms",
    ),
    "fixed k 0": (
        tandem_pb2.GenerateRequest(
            token_ids=_ids(1),
            max_new_tokens=4,
            speculation=tandem_pb2.Speculation(mode=tandem_pb2.SPECULATION_MODE_FIXED),
        ),
        "INVALID_ARGUMENT",
        "k",
    ),
    "fixed k huge": (
        tandem_pb2.GenerateRequest(
            token_ids=_ids(1),
            max_new_tokens=4,
            speculation=tandem_pb2.Speculation(mode=tandem_pb2.SPECULATION_MODE_FIXED, k=1000),
        ),
        "INVALID_ARGUMENT",
        "k",
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_get_clear_statuses(token_stack, case):
    msg, code, words = BAD_REQUESTS[case]
    channel, stub = _raw_stub(token_stack.address)
    with channel:
        for call in (stub.GenerateUnary, lambda m, **kw: list(stub.Generate(m, **kw))):
            with pytest.raises(grpc.RpcError) as info:
                call(msg, timeout=10)
            assert info.value.code().name == code, info.value.details()
            assert words in info.value.details()
        # nothing was queued, and the server still serves
        assert token_stack.scheduler.waiting == () and token_stack.scheduler.running == ()
        ok = stub.GenerateUnary(tandem_pb2.GenerateRequest(token_ids=_ids(1, 2), max_new_tokens=3), timeout=10)
        assert len(ok.token_ids) == 3


def test_abort_unknown_and_duplicate_ids(token_stack):
    channel, stub = _raw_stub(token_stack.address)
    with channel, Client(token_stack.address, timeout=30) as client:
        with pytest.raises(NotFoundError, match="nope"):
            client.abort("nope")
        stream = client.stream([1, 2, 3], max_new_tokens=200, request_id="dup", speculation="off")
        events = iter(stream)
        next(events)  # the request is running
        with pytest.raises(grpc.RpcError) as info:
            stub.GenerateUnary(tandem_pb2.GenerateRequest(request_id="dup", token_ids=_ids(1), max_new_tokens=2))
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert client.abort("dup") is True
        rest = list(events)
        assert stream.result.finish_reason == FinishReason.ABORTED
        assert len([t for ev in rest for t in ev.token_ids]) < 200
        assert client.abort("dup") is False  # finished: known, nothing to stop
    _wait(lambda: token_stack.target.seqs == {} and token_stack.draft.seqs == {})


def test_client_cancel_aborts_and_frees_kv(token_stack):
    client = Client(token_stack.address, timeout=30)
    with client, client.stream([4, 5], max_new_tokens=200, speculation=2) as stream:
        next(iter(stream))
        assert token_stack.target.seqs  # holds KV now
    # leaving the block early cancelled the call
    _wait(lambda: token_stack.scheduler.running == () and token_stack.target.seqs == {} and not token_stack.draft.seqs)


def test_text_prompt_stream_and_eos(text_stack):
    with Client(text_stack.address, timeout=30) as client:
        with client.stream("hello world", max_new_tokens=60) as stream:
            events = list(stream)
        result = stream.result
    codec_ids = [CHARS.index(c) for c in "helloworld"]
    expected = _until_eos(text_stack.lm.generate(codec_ids, 60), eos=EOS)
    assert result.token_ids == expected
    assert result.text == "".join(ev.text for ev in events) == "".join(CHARS[t] for t in expected)
    assert result.num_prompt_tokens == len(codec_ids)
    if expected[-1] == EOS:
        assert result.finish_reason == FinishReason.EOS
    # a client stop id that happens to be EOS is a STOP, not an EOS
    with Client(text_stack.address, timeout=30) as client:
        stop_result = client.generate("hello world", max_new_tokens=60, stop_token_ids=[EOS])
    if expected[-1] == EOS:
        assert stop_result.finish_reason == FinishReason.STOP


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def test_info_reports_policies_load_and_target(token_stack):
    with Client(token_stack.address) as client:
        info = client.info()
        assert client.health() == "SERVING"
    assert info.service_version == "test"
    assert info.queue_policy == "fcfs" and info.speculation_policy == "fixed_chain"
    assert info.num_running == 0 and info.num_waiting == 0
    assert info.target is not None and info.target.vocab_size == VOCAB
    assert info.draft is None


def test_metrics_follow_the_requests(token_stack):
    with Client(token_stack.address, timeout=30) as client:
        client.generate([1, 2, 3], max_new_tokens=12, speculation=3, slo_tpot_ms=5000)
        client.generate([3, 2, 1], max_new_tokens=12, speculation="off")
    # the finishing counters come from a deferrable observer, which may run just after the reply
    _wait(lambda: 'tandem_requests_total{finish_reason="length"} 2.0' in token_stack.metrics.render(), timeout=10)
    text = token_stack.metrics.render()
    assert 'tandem_requests_total{finish_reason="length"} 2.0' in text
    assert 'tandem_slo_requests_total{outcome="attained",slo_class="tpot>1000ms"} 1.0' in text
    assert "tandem_generated_tokens_total 24.0" in text
    assert 'tandem_position_proposed_total{position="0"}' in text
    assert 'tandem_queue_depth{queue="all"} 0.0' in text


def _wait(cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
