"""Admission control and request limits at the public endpoint: clear statuses naming the limit,
a retry hint when the queue is full, nothing queued or leaked, valid requests still served."""

from __future__ import annotations

import time

import grpc
import pytest

from scheduler.engine_loop import SchedulerConfig
from services.scheduler.queue_gate import DEFAULT_RETRY_MS, QueueGate
from services.scheduler.text import TextCodec
from services.scheduler.translate import Limits
from shared.rpc.gen.tandem.v1 import tandem_pb2, tandem_pb2_grpc
from tests.support.fake_stack import MAX_CONTEXT, VOCAB, CharTokenizer, fake_stack

SMALL = Limits(
    VOCAB, MAX_CONTEXT, max_prompt_bytes=64, max_prompt_tokens=20, max_new_tokens=50,
    max_stop_strings=2, max_stop_chars=8, max_stop_token_ids=3,
)


def _ids(*ids: int) -> tandem_pb2.TokenIds:
    return tandem_pb2.TokenIds(ids=list(ids))


OVER_LIMITS = {
    "prompt bytes": (tandem_pb2.GenerateRequest(text="é" * 40, max_new_tokens=4), "TANDEM_MAX_PROMPT_BYTES"),
    "prompt tokens": (tandem_pb2.GenerateRequest(token_ids=_ids(*[1] * 21), max_new_tokens=4),
                      "TANDEM_MAX_PROMPT_TOKENS"),
    "prompt tokens (text)": (tandem_pb2.GenerateRequest(text="a" * 21, max_new_tokens=4), "TANDEM_MAX_PROMPT_TOKENS"),
    "max_new_tokens": (tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=51), "TANDEM_MAX_NEW_TOKENS"),
    "stop strings": (tandem_pb2.GenerateRequest(text="ab", max_new_tokens=4, stop=["x", "y", "z"]),
                     "TANDEM_MAX_STOP_STRINGS"),
    "stop chars": (tandem_pb2.GenerateRequest(text="ab", max_new_tokens=4, stop=["abcdefghi"]),
                   "TANDEM_MAX_STOP_CHARS"),
    "stop ids": (tandem_pb2.GenerateRequest(token_ids=_ids(1), max_new_tokens=4, stop_token_ids=[1, 2, 3, 4]),
                 "TANDEM_MAX_STOP_TOKEN_IDS"),
}


@pytest.fixture(scope="module")
def limited_stack():
    with fake_stack(TextCodec(CharTokenizer()), limits=SMALL) as stack:
        yield stack


@pytest.mark.parametrize("case", list(OVER_LIMITS))
def test_each_limit_names_itself_and_leaves_the_server_serving(limited_stack, case):
    msg, variable = OVER_LIMITS[case]
    with grpc.insecure_channel(limited_stack.address) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GenerateUnary(msg, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert variable in info.value.details() and "limit" in info.value.details()
        assert limited_stack.scheduler.waiting == () and limited_stack.scheduler.running == ()
        at_limits = tandem_pb2.GenerateRequest(text="a" * 20, max_new_tokens=50, stop=["zz", "yy"],
                                               stop_token_ids=[1, 2, 3])
        ok = stub.GenerateUnary(at_limits, timeout=10)  # exactly at every limit: served
        assert 0 < len(ok.token_ids) <= 50


def test_a_message_past_the_public_size_bound_is_refused_by_grpc():
    from shared.rpc.server import public_options

    receive = dict(public_options(64))["grpc.max_receive_message_length"]
    assert receive == 1 << 20  # at least 1 MiB however small the prompt cap
    assert dict(public_options(8 << 20))["grpc.max_receive_message_length"] == (8 << 20) + (64 << 10)


def test_a_full_queue_answers_resource_exhausted_with_a_retry_hint_and_loses_nothing():
    config = SchedulerConfig(max_batch_size=1)
    with fake_stack(None, max_queue=2, config=config) as stack, grpc.insecure_channel(stack.address) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        stack.target.held = True  # the first request cannot finish before the queue is seen full
        calls = [stub.GenerateUnary.future(tandem_pb2.GenerateRequest(token_ids=_ids(i + 1, 2), max_new_tokens=60),
                                           timeout=30) for i in range(3)]
        deadline = time.monotonic() + 20
        while len(stack.scheduler.waiting) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(stack.scheduler.waiting) == 2 and len(stack.scheduler.running) == 1
        with pytest.raises(grpc.RpcError) as info:
            stub.GenerateUnary(tandem_pb2.GenerateRequest(token_ids=_ids(9), max_new_tokens=4), timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "TANDEM_MAX_QUEUE=2" in info.value.details()
        hint = dict(info.value.trailing_metadata())["grpc-retry-pushback-ms"]
        assert int(hint) > 0
        stack.target.held = False
        results = [c.result() for c in calls]  # the queued ones are all served in full
        assert [len(r.token_ids) for r in results] == [60, 60, 60]
        for i, r in enumerate(results):
            assert list(r.token_ids) == stack.lm.generate([i + 1, 2], 60)
        ok = stub.GenerateUnary(tandem_pb2.GenerateRequest(token_ids=_ids(9), max_new_tokens=4), timeout=10)
        assert len(ok.token_ids) == 4


def test_the_retry_hint_follows_the_finishing_rate():
    gate = QueueGate(4)
    gate.check(3)  # under the bound: no error
    with pytest.raises(Exception) as info:
        gate.check(4)
    assert info.value.retry_after_ms == DEFAULT_RETRY_MS  # nothing finished yet
    for t in (0.0, 0.1, 0.2, 0.3):
        gate.on_finish(t)
    assert gate.retry_after_ms(4) == pytest.approx(100, abs=1)  # one request past: one finish gap
    assert gate.retry_after_ms(7) == pytest.approx(400, abs=2)
    assert gate.num_refused == 1
    with pytest.raises(ValueError):
        QueueGate(0)
