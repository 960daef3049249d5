"""What users of the OpenAI API expect, with the real `openai` client against a running stack (SmolLM2
target in float32, the SmolLM2 draft, scheduler with its HTTP port): log-probabilities equal to the target's
own (transformers, separately) with and without speculation, echo for prompt log-probabilities, n samples
reproducible by seed, every sampling parameter changing the output as defined, and the HTTP hygiene
(X-Request-Id, model names, roles, out-of-range values, /tokenize, /detokenize, /version, /metrics).

The gRPC SDK (sdk.Client, AsyncClient, `tandem generate`) against the same stack: its log-probabilities equal
the HTTP API's and the target's, streamed and unary alike; its sampling knobs act as defined; its n samples
are the HTTP API's n."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import httpx
import openai
import pytest
import torch

from sdk import AsyncClient, Client, FinishReason
from services.settings import ServiceSettings
from shared.engine.sampling import probs_from_logits
from shared.engine.types import SamplingParams
from shared.state.redis_server import start_redis
from tests.support.loop_thread import LoopThread
from tests.support.model_services import serving

MODEL = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)  # the module's stack loads two models first (minutes on a busy 2-core CPU)
PROMPT = "The capital of France is Paris. The capital of Germany is"
SPECULATION = [{"speculation": "off"}, {"speculation": 3}]


@pytest.fixture(scope="module")
def stack(smollm2_dir, tmp_path_factory) -> Iterator[dict]:
    from services.scheduler.main import start

    home = tmp_path_factory.mktemp("home")
    redis = start_redis()
    with LoopThread() as loop:
        cm = serving(smollm2_dir, smollm2_dir.parent / "smollm2-draft", num_blocks=512, block_size=16, dtype="float32",
                     metrics_port=0)
        target, draft = loop.run(cm.__aenter__(), timeout=600)
        settings = ServiceSettings(model=str(smollm2_dir), target_addr=target.address, draft_addr=draft.address,
                                   redis_url=redis.url, port=0, http_port=0, trace_exporter="memory",
                                   metrics_port=None, home=home, max_batch_size=8)
        running = loop.run(start(settings), timeout=600)
        try:
            yield {"http": f"http://127.0.0.1:{running.http_port}", "grpc": running.address, "running": running,
                   "dir": smollm2_dir,
                   "service_metrics": [f"http://127.0.0.1:{s.metrics_port}/metrics" for s in (target, draft)]}
        finally:
            loop.run(running.stop(0))
            loop.run(cm.__aexit__(None, None, None))
            redis.stop()


@cache
def _hf(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def log_softmax(stack, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] the target's log-softmax after each prefix, through transformers alone."""
    model, _ = _hf(stack["dir"])
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def prompt_ids(stack, text=PROMPT) -> list[int]:
    return list(_hf(stack["dir"])[1](text)["input_ids"])


def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["http"] + "/v1", api_key="none", max_retries=0, timeout=300)


def ids_of(tokens: list[str]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in tokens]


@pytest.mark.parametrize("spec", SPECULATION, ids=["plain", "speculative"])
def test_completion_logprobs_are_the_targets_log_softmax(stack, spec):
    out = client(stack).completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=5,
                                           extra_body=spec | {"return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    ids = ids_of(lp.tokens)
    prompt = prompt_ids(stack)
    ref = log_softmax(stack, prompt + ids)
    for i, (tok, value, top) in enumerate(zip(ids, lp.token_logprobs, lp.top_logprobs)):
        row = ref[len(prompt) - 1 + i]
        assert int(row.argmax()) == tok  # greedy
        assert abs(value - float(row[tok])) < 1e-4
        values, top_ids = row.topk(5)
        assert ids_of(list(top)) == top_ids.tolist()
        assert max(abs(a - float(b)) for a, b in zip(top.values(), values)) < 1e-4
    if spec["speculation"] == 3:
        assert out.usage.model_extra["tandem"]["num_draft_tokens"] > 0


@pytest.mark.parametrize("spec", SPECULATION, ids=["plain", "speculative"])
def test_sampled_logprobs_report_the_distribution_sampled_from(stack, spec):
    params = SamplingParams(temperature=0.7, top_p=0.9)
    out = client(stack).completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0.7, top_p=0.9,
                                           seed=4, logprobs=1, extra_body=spec | {"return_tokens_as_token_ids": True})
    lp = out.choices[0].logprobs
    ids, prompt = ids_of(lp.tokens), prompt_ids(stack)
    model, _ = _hf(stack["dir"])
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ids])).logits[0].float()
    probs = probs_from_logits(logits[len(prompt) - 1 : -1], params)  # [n, vocab]
    for i, (tok, value) in enumerate(zip(ids, lp.token_logprobs)):
        assert abs(value - float(probs[i, tok].log())) < 1e-4


def test_echo_gives_the_prompts_logprobs(stack):
    out = client(stack).completions.create(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1,
                                           temperature=0, extra_body={"return_tokens_as_token_ids": True})
    choice = out.choices[0]
    prompt = prompt_ids(stack)
    assert choice.text == PROMPT and ids_of(choice.logprobs.tokens) == prompt and out.usage.completion_tokens == 0
    ref = log_softmax(stack, prompt)
    assert choice.logprobs.token_logprobs[0] is None
    for t in range(1, len(prompt)):
        assert abs(choice.logprobs.token_logprobs[t] - float(ref[t - 1, prompt[t]])) < 1e-4


@pytest.mark.parametrize("spec", SPECULATION, ids=["plain", "speculative"])
def test_chat_logprobs_streamed_and_whole_agree(stack, spec):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0,
              logprobs=True, top_logprobs=2, extra_body=spec)
    whole = client(stack).chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    assert "".join(c.token for c in content).startswith(whole.choices[0].message.content.strip()[:3])
    chunks = list(client(stack).chat.completions.create(stream=True, **kw))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.token for c in streamed] == [c.token for c in content]
    # within float noise: the second call's prompt comes from the prefix cache, a forward of another shape
    assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(streamed, content))


def test_n_samples_are_reproducible_by_seed(stack):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0, n=4, seed=21)
    a = client(stack).completions.create(**kw)
    b = client(stack).completions.create(**kw)
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(a.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    assert texts == [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert len(set(texts)) > 1  # the samples differ from each other
    single = client(stack).completions.create(**(kw | {"n": 1}))
    assert single.choices[0].text == texts[0]  # sample 0 draws with the request's seed itself
    assert 4 <= a.usage.completion_tokens <= 32 and a.usage.prompt_tokens == single.usage.prompt_tokens
    chunks = list(client(stack).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                        max_tokens=4, n=2, seed=1, temperature=1.0, stream=True))
    assert {ch.choices[0].index for ch in chunks if ch.choices} == {0, 1}


def reference_greedy(stack, prompt: list[int], n: int, rep=1.0, freq=0.0, pres=0.0) -> list[int]:
    """Greedy decoding with the penalties as OpenAI / vLLM define them, one transformers forward per token."""
    model, _ = _hf(stack["dir"])
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            out = ids[len(prompt):]
            for t in set(ids):
                if rep != 1.0:
                    logits[t] = logits[t] / rep if logits[t] > 0 else logits[t] * rep
            for t in set(out):
                logits[t] -= freq * out.count(t) + pres
            ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("spec", SPECULATION, ids=["plain", "speculative"])
@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.5}, {"frequency_penalty": 1.5}, {"presence_penalty": 1.5}],
                         ids=["repetition", "frequency", "presence"])
def test_penalties_follow_their_definitions(stack, penalty, spec):
    prompt = prompt_ids(stack, "The cat sat on the mat. The cat sat on the")
    body = dict(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=0)
    plain = client(stack).completions.create(**body, extra_body=spec | {"return_tokens_as_token_ids": True})
    out = client(stack).completions.create(**body, extra_body=spec | penalty | {"return_tokens_as_token_ids": True})
    got = ids_of(out.choices[0].logprobs.tokens)
    names = {"repetition_penalty": "rep", "frequency_penalty": "freq", "presence_penalty": "pres"}
    assert got == reference_greedy(stack, prompt, 12, **{names[k]: v for k, v in penalty.items()})
    assert got != ids_of(plain.choices[0].logprobs.tokens)


def test_top_k_min_p_stop_ids_min_tokens_and_ignore_eos(stack):
    c = client(stack)
    greedy = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                  logprobs=0, extra_body={"return_tokens_as_token_ids": True})
    for extra in ({"top_k": 1}, {"min_p": 1.0}):  # one token left: sampling at any temperature is greedy
        hot = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=2.0, seed=3, extra_body=extra)
        assert hot.choices[0].text == greedy.choices[0].text
    ids = ids_of(greedy.choices[0].logprobs.tokens)
    stopped = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0,
                                   extra_body={"stop_token_ids": [ids[3]]})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == ids.index(ids[3]) + 1
    short = dict(model=MODEL, messages=[{"role": "user", "content": "Answer with one word: is the sky blue?"}],
                 max_tokens=40, temperature=0)
    base = c.chat.completions.create(**short)
    n = base.usage.completion_tokens
    assert base.choices[0].finish_reason == "stop" and n < 30  # the model ends its answer (EOS)
    longer = c.chat.completions.create(**short, extra_body={"min_tokens": n + 5})
    assert longer.usage.completion_tokens >= n + 5
    endless = c.chat.completions.create(**short, extra_body={"ignore_eos": True})
    assert endless.usage.completion_tokens == 40 and endless.choices[0].finish_reason == "length"


def test_hygiene(stack):
    c = client(stack)
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=1_000_000_000_000)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}], max_tokens=2)
    assert "role" in info.value.message
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-4o", prompt="hi", max_tokens=2)
    for alias in ("tandem", str(stack["dir"])):
        out = c.completions.create(model=alias, prompt="hi", max_tokens=2)
        assert out.model == alias
    assert [m.id for m in c.models.list().data][0] == MODEL
    r = httpx.post(stack["http"] + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                   headers={"X-Request-Id": "my-req-1"})
    assert r.headers["x-request-id"] == "my-req-1" and r.json()["id"] == "my-req-1"
    r = httpx.post(stack["http"] + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert r.headers["x-request-id"] == r.json()["id"]
    tok = httpx.post(stack["http"] + "/tokenize", json={"prompt": PROMPT}).json()
    assert tok["tokens"] == prompt_ids(stack) and tok["count"] == len(tok["tokens"])
    assert httpx.post(stack["http"] + "/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == PROMPT
    chat_tok = httpx.post(stack["http"] + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}],
                                                            "chat_template_kwargs": {"unused": 1}})
    assert chat_tok.status_code == 200 and chat_tok.json()["count"] > 3
    assert httpx.get(stack["http"] + "/version").json()["version"]
    metrics = httpx.get(stack["http"] + "/metrics").text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:spec_decode_num_draft_tokens_total"):
        assert name in metrics
    target_metrics, draft_metrics = (httpx.get(url).text for url in stack["service_metrics"])
    assert 'tandem_engine_call_seconds_count{call="step",role="target"}' in target_metrics
    assert 'tandem_target_steps_total{path="static_host_accept"}' in target_metrics
    assert 'tandem_kv_blocks{role="draft",state="used"}' in draft_metrics


# --- the gRPC SDK against the same stack ---------------------------------------------------------------


def _close(a: float, b: float, tol: float) -> bool:
    return a == b or abs(a - b) < tol  # -inf == -inf


@pytest.mark.parametrize("spec", SPECULATION, ids=["plain", "speculative"])
def test_sdk_logprobs_equal_the_http_apis_and_the_targets_streamed_or_not(stack, spec):
    prompt = prompt_ids(stack)
    http = client(stack).completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=5,
                                            extra_body=spec | {"return_tokens_as_token_ids": True})
    lp = http.choices[0].logprobs
    kw = dict(max_new_tokens=10, logprobs=5, prompt_logprobs=2, speculation=spec["speculation"])
    with Client(stack["grpc"], timeout=300) as c:
        unary = c.generate(prompt, **kw)
        with c.stream(prompt, **kw) as stream:
            events = list(stream)
    assert unary.token_ids == ids_of(lp.tokens) and [x.token_id for x in unary.logprobs] == unary.token_ids
    for mine, value, top in zip(unary.logprobs, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert _close(mine.logprob, value, 1e-5)
        assert [a.token_id for a in mine.top] == ids_of(list(top))
        assert all(_close(a.logprob, b, 1e-5) for a, b in zip(mine.top, top.values(), strict=True))
    ref = log_softmax(stack, prompt + unary.token_ids)  # [len(prompt) + 10, vocab]
    for i, mine in enumerate(unary.logprobs):
        assert abs(mine.logprob - float(ref[len(prompt) - 1 + i, mine.token_id])) < 1e-4
    assert [x.token_id for x in unary.prompt_logprobs] == prompt[1:]
    for t, mine in enumerate(unary.prompt_logprobs, start=1):
        assert abs(mine.logprob - float(ref[t - 1, prompt[t]])) < 1e-4
        assert [a.token_id for a in mine.top] == ref[t - 1].topk(2).indices.tolist()
    assert all(len(e.logprobs) == len(e.token_ids) for e in events)
    assert not any(e.prompt_logprobs for e in events[1:])
    streamed = [x for e in events for x in e.logprobs]
    assert streamed == stream.result.logprobs and events[0].prompt_logprobs == stream.result.prompt_logprobs
    assert [x.token_id for x in streamed] == unary.token_ids
    assert all(_close(a.logprob, b.logprob, 1e-5) for a, b in zip(streamed, unary.logprobs, strict=True))
    assert all(_close(a.logprob, b.logprob, 1e-5) for a, b in zip(events[0].prompt_logprobs, unary.prompt_logprobs,
                                                                   strict=True))  # fmt: skip
    if spec["speculation"] == 3:
        assert unary.stats.num_draft_tokens > 0


def test_async_sdk_sampled_logprobs_equal_the_http_apis(stack):
    body = dict(max_tokens=10, temperature=0.7, top_p=0.9, seed=4)
    http = client(stack).completions.create(model=MODEL, prompt=PROMPT, logprobs=1, **body,
                                            extra_body={"return_tokens_as_token_ids": True, "speculation": "off"})
    lp = http.choices[0].logprobs

    async def main():
        async with AsyncClient(stack["grpc"], timeout=300) as c:
            kw = dict(max_new_tokens=10, temperature=0.7, top_p=0.9, seed=4, logprobs=1, speculation="off")
            stream = c.stream(PROMPT, **kw)
            events = [e async for e in stream]
            return await c.generate(PROMPT, **kw), events, stream.result

    unary, events, streamed = asyncio.run(main())
    assert unary.token_ids == ids_of(lp.tokens) == streamed.token_ids
    assert all(_close(a.logprob, b, 1e-5) for a, b in zip(unary.logprobs, lp.token_logprobs, strict=True))
    assert [len(x.top) for x in unary.logprobs] == [1] * 10
    assert [x for e in events for x in e.logprobs] == streamed.logprobs
    assert all(_close(a.logprob, b.logprob, 1e-5) for a, b in zip(streamed.logprobs, unary.logprobs, strict=True))


def test_sdk_sampling_knobs_act_as_defined(stack):
    cat = prompt_ids(stack, "The cat sat on the mat. The cat sat on the")
    short = [{"role": "user", "content": "Answer with one word: is the sky blue?"}]
    with Client(stack["grpc"], timeout=300) as c:
        greedy = c.generate(PROMPT, max_new_tokens=8)
        assert c.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=3).token_ids != greedy.token_ids
        for knob in ({"top_k": 1}, {"min_p": 1.0}):  # one token left: sampling at temperature 1 is greedy
            assert c.generate(PROMPT, max_new_tokens=8, temperature=1.0, seed=3, **knob).token_ids == greedy.token_ids
        plain = c.generate(cat, max_new_tokens=12).token_ids
        for knob, ref in (("repetition_penalty", "rep"), ("frequency_penalty", "freq"), ("presence_penalty", "pres")):
            got = c.generate(cat, max_new_tokens=12, **{knob: 1.5}).token_ids
            assert got == reference_greedy(stack, cat, 12, **{ref: 1.5}) and got != plain, knob
        base = c.generate(short, max_new_tokens=40)
        n = base.num_generated
        assert base.finish_reason == FinishReason.EOS and n < 30
        longer = c.generate(short, max_new_tokens=40, min_tokens=n + 5)
        assert longer.num_generated >= n + 5 and longer.token_ids[: n - 1] == base.token_ids[: n - 1]
        endless = c.generate(short, max_new_tokens=40, ignore_eos=True)
        assert endless.num_generated == 40 and endless.finish_reason == FinishReason.LENGTH


def test_sdk_samples_are_the_http_apis_n(stack):
    http = client(stack).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=1.0,
                                            n=4, seed=21)  # fmt: skip
    with Client(stack["grpc"], timeout=300) as c:
        mine = c.samples("Once upon a time", 4, max_new_tokens=8, temperature=1.0, seed=21)
    assert [r.text for r in mine] == [ch.text for ch in sorted(http.choices, key=lambda ch: ch.index)]
    assert len({r.text for r in mine}) > 1


def test_tandem_generate_takes_the_sampling_knobs_and_prints_logprobs(stack):
    prompt = prompt_ids(stack)
    with Client(stack["grpc"], timeout=300) as c:
        greedy = c.generate(prompt, max_new_tokens=6, logprobs=0)
    ids = ",".join(map(str, prompt))
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}

    def tandem(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "sdk.cli", "generate", ids, "--ids", "--addr", stack["grpc"],
                               "--max-new-tokens", "6", *args], capture_output=True, text=True, env=env, timeout=300)

    done = tandem("--temperature", "1", "--seed", "3", "--top-k", "1", "--min-p", "0.5", "--repetition-penalty", "1",
                  "--logprobs", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == greedy.text.strip()
    rows = [line.split() for line in done.stderr.splitlines() if re.match(r"\d+\s+\d+\s", line)]  # the table's
    assert [int(r[1]) for r in rows] == greedy.token_ids and all(len(r) == 5 for r in rows)  # 2 alternatives
    assert all(float(r[2]) == 0.0 for r in rows)  # top-k 1: the only token left has probability 1
    bad = tandem("--logprobs", "21")
    assert bad.returncode == 1 and "sampling.logprobs" in bad.stderr
