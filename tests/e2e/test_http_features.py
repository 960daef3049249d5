"""What users of the OpenAI API expect, with the real `openai` client against a running stack (SmolLM2
target in float32, the SmolLM2 draft, scheduler with its HTTP port): log-probabilities equal to the target's
own (transformers, separately) with and without speculation, echo for prompt log-probabilities, n samples
reproducible by seed, every sampling parameter changing the output as defined, and the HTTP hygiene
(X-Request-Id, model names, roles, out-of-range values, /tokenize, /detokenize, /version, /metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import httpx
import openai
import pytest
import torch

from services.settings import ServiceSettings
from shared.engine.sampling import probs_from_logits
from shared.engine.types import SamplingParams
from shared.state.redis_server import start_redis
from tests.support.loop_thread import LoopThread
from tests.support.model_services import serving

MODEL = "smollm2-135m-instruct"
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
            yield {"http": f"http://127.0.0.1:{running.http_port}", "running": running, "dir": smollm2_dir,
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
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == [(c.token, round(c.logprob, 4)) for c in content]


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
