"""Structured output through the OpenAI-compatible API with the real `openai` client, speculation on.

A running stack (SmolLM2 target, the distilled smollm2-draft, scheduler with TANDEM_HTTP_PORT):
a JSON schema is answered with JSON that parses and validates, and greedily the speculative answer
is the non-speculative one token for token; json_object, regex and choice; the gRPC SDK gives the
same answer; a bad schema, regex or response_format is a clear 400 and the server keeps serving.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from sdk import Client
from services.settings import ServiceSettings
from shared.state.redis_server import start_redis
from tests.support.loop_thread import LoopThread
from tests.support.model_services import serving

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PERSON = [{"role": "user", "content": "Describe Ada Lovelace, aged 36, from London, as JSON."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


@pytest.fixture(scope="module")
def stack(smollm2_dir, tmp_path_factory) -> Iterator[dict]:
    from services.scheduler.main import start
    from shared.models.smollm2_draft import NAME

    draft_dir = smollm2_dir.parent / NAME
    if not (draft_dir / "config.json").is_file():
        pytest.skip(f"the demo draft is not prepared at {draft_dir}")
    home = tmp_path_factory.mktemp("home")
    redis = start_redis()
    with LoopThread() as loop:
        cm = serving(smollm2_dir, draft_dir, num_blocks=512, block_size=16)
        target, draft = loop.run(cm.__aenter__(), timeout=900)
        settings = ServiceSettings(model=str(smollm2_dir), target_addr=target.address, draft_addr=draft.address,
                                   redis_url=redis.url, port=0, http_port=0, trace_exporter="memory",
                                   metrics_port=None, home=home, max_batch_size=4)  # fmt: skip
        running = loop.run(start(settings), timeout=900)
        try:
            yield {"http": f"http://127.0.0.1:{running.http_port}/v1", "grpc": running.address}
        finally:
            loop.run(running.stop(0))
            loop.run(cm.__aexit__(None, None, None))
            redis.stop()


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["http"], api_key="none", max_retries=0, timeout=300)


def _chat(client, speculation, **kw):
    return client.chat.completions.create(model="tandem", messages=PERSON, max_tokens=64, temperature=0,
                                          extra_body={"speculation": speculation}, **kw)  # fmt: skip


def test_json_schema_under_speculation_is_valid_and_greedily_identical(client, stack):
    spec = _chat(client, 4, response_format=FORMAT)
    plain = _chat(client, "off", response_format=FORMAT)
    text = spec.choices[0].message.content
    jsonschema.validate(json.loads(text), SCHEMA)
    assert spec.choices[0].finish_reason == "stop"  # the grammar ended the answer, not max_tokens
    assert text == plain.choices[0].message.content
    assert spec.usage.completion_tokens == plain.usage.completion_tokens
    tandem = spec.usage.model_extra["tandem"]
    assert tandem["num_draft_tokens"] > 0 and tandem["num_accepted_tokens"] > 0  # speculation really ran
    with Client(stack["grpc"]) as grpc_client:  # the SDK's json_schema: the same grammar, the same answer
        result = grpc_client.generate(PERSON, max_new_tokens=64, json_schema=SCHEMA, speculation=4)
    assert result.text == text


def test_json_object_regex_and_choice(client):
    short = [{"role": "user", "content": 'Reply with the JSON object {"ok": true} and nothing else.'}]
    spec, plain = (client.chat.completions.create(model="tandem", messages=short, max_tokens=96, temperature=0,
                                                  response_format={"type": "json_object"},
                                                  extra_body={"speculation": s}) for s in (4, "off"))  # fmt: skip
    assert spec.choices[0].finish_reason == "stop", spec.choices[0].message.content  # the grammar closed it
    assert isinstance(json.loads(spec.choices[0].message.content), dict)
    assert spec.choices[0].message.content == plain.choices[0].message.content
    pattern = r"[0-9]{3}-[0-9]{4}"
    number = client.completions.create(model="tandem", prompt="Call me at", max_tokens=16, temperature=0,
                                       extra_body={"regex": pattern, "speculation": 3})  # fmt: skip
    assert re.fullmatch(pattern, number.choices[0].text)
    choices = ["positive", "negative", "neutral"]
    mood = client.chat.completions.create(
        model="tandem", max_tokens=8, temperature=0, extra_body={"choice": choices, "speculation": 3},
        messages=[{"role": "user", "content": "Sentiment of 'I love this!'?"}],
    )  # fmt: skip
    assert mood.choices[0].message.content in choices


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     None, "nonsense"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema",
     "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
    ({"regex": "a(b"}, None, "unclosed group"),
    ({"choice": []}, "choice", "non-empty"),
    ({"regex": "a", "choice": ["a"]}, "choice", "only one"),
])  # fmt: skip
def test_bad_grammars_are_400_with_the_reason(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tandem", prompt="Hi", max_tokens=4, extra_body=extra)
    error = caught.value.body
    assert words in error["message"], error
    if param is not None:
        assert error["param"] == param
    ok = client.completions.create(model="tandem", prompt="Hi", max_tokens=2, temperature=0)  # still serving
    assert ok.choices[0].text is not None
