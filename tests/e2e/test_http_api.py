"""The OpenAI-compatible HTTP API with the real `openai` client against a running stack (SmolLM2 target,
scheduler with TANDEM_HTTP_PORT): completion, chat, streaming with usage, stop, seed, errors, keys,
a disconnect that frees the request, and greedy output identical to the gRPC endpoint's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from sdk import Client
from services.settings import ServiceSettings
from shared.state.redis_server import start_redis
from tests.support.loop_thread import LoopThread
from tests.support.model_services import serving

KEY = "sk-test-http"
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def http_stack(smollm2_dir, tmp_path_factory) -> Iterator[dict]:
    from services.scheduler.main import start

    home = tmp_path_factory.mktemp("home")
    redis = start_redis()
    with LoopThread() as loop:
        cm = serving(smollm2_dir, num_blocks=512, block_size=16)
        target, _ = loop.run(cm.__aenter__())
        settings = ServiceSettings(model=str(smollm2_dir), target_addr=target.address, draft_addr="none",
                                   redis_url=redis.url, port=0, http_port=0, trace_exporter="memory",
                                   metrics_port=None, home=home, max_batch_size=4, api_keys=KEY)
        running = loop.run(start(settings))
        try:
            yield {"http": f"http://127.0.0.1:{running.http_port}", "grpc": running.address, "running": running}
        finally:
            loop.run(running.stop(0))
            loop.run(cm.__aexit__(None, None, None))
            redis.stop()


def _client(stack, key=KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["http"] + "/v1", api_key=key, max_retries=0, timeout=120)


def test_completion_chat_and_models(http_stack):
    client = _client(http_stack)
    assert [m.id for m in client.models.list().data][0] == MODEL
    comp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert comp.choices[0].text and comp.choices[0].finish_reason in ("length", "stop")
    assert comp.usage.completion_tokens <= 8 and comp.usage.prompt_tokens > 0
    tandem = comp.usage.model_extra["tandem"]
    assert tandem["ttft_ms"] > 0 and "mean_accepted_length" in tandem
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content


def test_streaming_with_usage_and_stop(http_stack):
    client = _client(http_stack)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count from 1 to 20."}],
                                            max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    full = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0)
    word = full.choices[0].text.strip()[:2]
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=[word])
    assert stopped.choices[0].finish_reason == "stop" and len(stopped.choices[0].text) < len(full.choices[0].text)


def test_seed_reproducibility_and_greedy_equals_grpc(http_stack):
    client = _client(http_stack)
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0.9)
    a = client.completions.create(seed=7, **kw).choices[0].text
    b = client.completions.create(seed=7, **kw).choices[0].text
    assert a == b
    greedy = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    with Client(http_stack["grpc"], api_key=KEY, timeout=120) as grpc_client:
        ref = grpc_client.generate("Once upon a time", max_new_tokens=12)
    assert greedy.choices[0].text == ref.text


def test_errors_are_openai_shaped(http_stack):
    with pytest.raises(openai.AuthenticationError):
        _client(http_stack, key="wrong").models.list()
    client = _client(http_stack)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=100_000)
    assert info.value.status_code == 400 and "context window" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:  # would change the answer: refused, not ignored
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"logit_bias": {"5": 3}})
    assert "'logit_bias' is not supported" in info.value.message
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2, presence_penalty=0).choices  # neutral: fine
    r = httpx.post(http_stack["http"] + "/v1/completions", content=b"{not json", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(http_stack["http"] + "/health").json() == {"status": "SERVING"}


def test_a_client_disconnect_frees_the_request(http_stack):
    scheduler = http_stack["running"].scheduler
    body = {"model": MODEL, "prompt": "Write a very long story about a dragon.", "max_tokens": 400, "stream": True}
    with httpx.stream("POST", http_stack["http"] + "/v1/completions", json=body,
                      headers={"authorization": f"Bearer {KEY}"}, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # one chunk in: the request runs; leaving the block hangs up
    deadline = time.monotonic() + 20
    while (scheduler.running or scheduler.waiting) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scheduler.running == () and scheduler.waiting == ()
