"""Structured-output fields: OpenAI's response_format and Tandem's regex / choice -> the wire Grammar -> the
scheduler's GrammarSpec, with every malformed case refused before a request is queued (pure, no models)."""

from __future__ import annotations

import json

import pytest

from sdk.client import build_request
from sdk.errors import InvalidRequestError as SdkInvalidRequest
from services.scheduler.errors import NoTokenizerError, TandemRequestError
from services.scheduler.translate import Limits, to_request
from shared.engine.types import GrammarSpec, PrefillItem
from shared.rpc.convert import prefill_item_from_pb, prefill_item_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2
from shared.rpc.grammar_fields import GrammarFieldError, grammar_of

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_each_form_becomes_one_grammar():
    schema = grammar_of({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}})
    assert schema.kind == common_pb2.GRAMMAR_KIND_JSON_SCHEMA and json.loads(schema.spec) == SCHEMA
    assert grammar_of({"response_format": {"type": "json_object"}}).kind == common_pb2.GRAMMAR_KIND_JSON_OBJECT
    assert grammar_of({"response_format": {"type": "text"}}) is None and grammar_of({}) is None
    assert grammar_of({"regex": "[0-9]+"}).spec == "[0-9]+"
    assert json.loads(grammar_of({"choice": ["a", "b"]}).spec) == ["a", "b"]
    assert grammar_of({"guided_json": json.dumps(SCHEMA)}).kind == common_pb2.GRAMMAR_KIND_JSON_SCHEMA  # vLLM's name


@pytest.mark.parametrize("fields, param", [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}, "response_format.json_schema.schema"),
    ({"regex": ""}, "regex"),
    ({"choice": ["a", ""]}, "choice"),
    ({"guided_json": "{nope"}, "guided_json"),
    ({"regex": "a", "choice": ["a"]}, "choice"),
])  # fmt: skip
def test_malformed_fields_name_themselves(fields, param):
    with pytest.raises(GrammarFieldError) as caught:
        grammar_of(fields)
    assert caught.value.param == param


def test_the_grammar_crosses_the_wire_to_the_engines():
    item = PrefillItem("s", [1, 2, 3], grammar=GrammarSpec("regex", "[a-z]+", start=3))
    assert prefill_item_from_pb(prefill_item_to_pb(item)) == item
    assert prefill_item_from_pb(prefill_item_to_pb(PrefillItem("s", [1]))).grammar is None


class _Codec:
    eos_token_ids = (0,)

    def encode(self, text: str) -> list[int]:
        return [ord(c) % 100 + 1 for c in text]


LIMITS = Limits(vocab_size=1000, max_context=512)


def test_the_scheduler_compiles_the_grammar_and_starts_it_after_the_prompt():
    pytest.importorskip("llguidance")
    request = to_request(build_request("Hello", max_new_tokens=8, json_schema=SCHEMA), LIMITS, _Codec())
    assert request.grammar == GrammarSpec("json_schema", json.dumps(SCHEMA), start=5)
    for kwargs, words in [({"json_schema": {"type": "nonsense"}}, "nonsense"), ({"regex": "a(b"}, "unclosed group"),
                          ({"json_schema": {"type": "object", "minProperties": "x"}}, "grammar")]:  # fmt: skip
        with pytest.raises(TandemRequestError, match=words):
            to_request(build_request("Hello", max_new_tokens=8, **kwargs), LIMITS, _Codec())
    with pytest.raises(NoTokenizerError, match="tokenizer"):
        to_request(build_request([5, 6], max_new_tokens=8, regex="x"), LIMITS, None)


def test_the_sdk_refuses_two_constraints_and_bad_shapes_before_any_call():
    with pytest.raises(SdkInvalidRequest, match="only one"):
        build_request("x", regex="a", choice=["a"])
    with pytest.raises(SdkInvalidRequest, match="json_schema"):
        build_request("x", json_schema=[1])
    assert build_request("x", choice=["yes", "no"]).grammar.kind == common_pb2.GRAMMAR_KIND_CHOICE
