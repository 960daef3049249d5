"""No body answers 5xx: hundreds of malformed, out-of-range and mistyped bodies against every HTTP route,
over the public servicer and toy workers (tests/support/fake_stack.py). Each answer is 2xx, or a 4xx with
the OpenAI error shape naming what was wrong."""

from __future__ import annotations

import json
import random

import httpx

from services.scheduler.http_api import build_app

BAD = [None, -1, 0, 1, 1.5, -1e308, 1e308, float("nan"), float("inf"), 2**64, -(2**70), 2**31, "", "x", "off",
       [], [None], [-5], [1, 2], [[1]], ["a" * 300], {}, {"a": []}, {"type": "json_object"}, True, False]
COMMON = ["model", "max_tokens", "max_completion_tokens", "stop", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "min_tokens", "stop_token_ids", "ignore_eos",
          "seed", "n", "best_of", "stream", "stream_options", "slo_tpot_ms", "slo_ttft_ms", "speculation",
          "priority", "logit_bias", "suffix", "response_format", "tools", "user", "return_tokens_as_token_ids"]
ROUTES = {
    "/v1/completions": ({"model": "toy", "prompt": "abc", "max_tokens": 3},
                        COMMON + ["prompt", "logprobs", "echo"]),
    "/v1/chat/completions": ({"model": "toy", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 3},
                             COMMON + ["messages", "logprobs", "top_logprobs", "chat_template_kwargs",
                                       "add_generation_prompt"]),
    "/tokenize": ({"prompt": "abc"}, ["model", "prompt", "messages", "add_special_tokens", "chat_template_kwargs"]),
    "/detokenize": ({"tokens": [1, 2]}, ["model", "tokens"]),
}
MESSAGES = [[], [{}], [{"role": "wizard", "content": "hi"}], [{"role": "user", "content": 5}], "hi",
            [{"role": "user", "content": [{"type": "text", "text": 5}]}], [{"role": "user"}], [None]]
RAW = [b"", b"[]", b"null", b"{", b"\xff\xfe", b'{"prompt": "\\ud800", "max_tokens": 2}', b"[" * 50_000,
       b'{"prompt": "abc", "max_tokens": 1e999999}', b'{"prompt": "abc", "temperature": NaN}', b'"text"', b"1"]


def _check(r: httpx.Response, what) -> None:
    assert r.status_code < 500, (what, r.status_code, r.text[:300])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and error["type"], what


def test_no_body_answers_5xx(text_stack):
    app = build_app(text_stack.servicer, model_name="toy", metrics=text_stack.metrics.exposition)
    rng = random.Random(0)

    async def run() -> int:
        transport = httpx.ASGITransport(app=app)
        count = 0
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            for route, (base, fields) in ROUTES.items():
                for raw in RAW:
                    _check(await client.post(route, content=raw), (route, raw[:40]))
                    count += 1
                for _ in range(120):
                    body = dict(base)
                    for name in rng.sample(fields, rng.randint(1, min(3, len(fields)))):
                        pool = MESSAGES + BAD if name == "messages" else BAD
                        body[name] = rng.choice(pool)
                    content = json.dumps(body, allow_nan=True).encode()
                    _check(await client.post(route, content=content, headers={"content-type": "application/json"}),
                           (route, body))
                    count += 1
            for header in ("bad id with spaces", "x" * 200, "ok-id"):
                r = await client.post("/v1/completions", json=ROUTES["/v1/completions"][0],
                                      headers={"X-Request-Id": header})
                _check(r, header)
                assert (r.status_code == 200) == (header == "ok-id")
            for path in ("/metrics", "/version", "/health", "/v1/models"):
                assert (await client.get(path)).status_code == 200
        return count

    assert text_stack.loop.run(run(), timeout=900) > 400


def test_stop_strings_end_the_text_whole_and_streamed(text_stack):
    app = build_app(text_stack.servicer, model_name="toy")

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=60) as client:
            body = {"prompt": "abc", "max_tokens": 12, "temperature": 0}
            full = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
            stop = full[3:5]
            cut = full[: full.index(stop)]
            whole = (await client.post("/v1/completions", json=body | {"stop": [stop]})).json()["choices"][0]
            kept = (await client.post("/v1/completions", json=body | {"stop": stop, "include_stop_str_in_output": True}))
            lines = []
            async with client.stream("POST", "/v1/completions", json=body | {"stop": [stop], "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        lines.append(json.loads(line[6:])["choices"][0]["text"])
            return full, stop, cut, whole, kept.json()["choices"][0]["text"], lines

    full, stop, cut, whole, kept, chunks = text_stack.loop.run(run(), timeout=120)
    assert whole["text"] == cut and whole["finish_reason"] == "stop" and stop not in whole["text"]
    assert kept == cut + stop
    assert "".join(chunks) == cut and all(stop not in c for c in chunks)
