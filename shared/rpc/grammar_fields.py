"""OpenAI's ``response_format`` and Tandem's ``regex`` / ``choice`` fields -> one wire ``Grammar`` (HTTP API and SDK).

    response_format {"type": "text"}                                   free text (no grammar)
    response_format {"type": "json_object"}                            any JSON object
    response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}
    regex  "<pattern>"          Tandem extension (``extra_body``): text matching the regex
    choice ["a", "b", ...]      Tandem extension: exactly one of the strings
    guided_json / guided_regex / guided_choice                         vLLM's names, accepted as aliases

At most one of them per request. Only the shape is checked here; the schema or regex itself is
compiled by translate.py (the same check the gRPC endpoint runs), which names what is wrong.
"""

from __future__ import annotations

import json
from typing import Any

from shared.rpc.gen.tandem.v1 import common_pb2

ALIASES = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice"}


class GrammarFieldError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def grammar_of(extra: dict[str, Any]) -> common_pb2.Grammar | None:
    """The grammar a chat or completion body asks for (its fields beyond the typed ones), or None."""
    found = []
    fmt = extra.get("response_format")
    if fmt is not None:
        grammar = _response_format(fmt)
        if grammar is not None:
            found.append(("response_format", grammar))
    for name in ("regex", "choice", *ALIASES):
        if extra.get(name) is not None:
            found.append((name, _extension(name, extra[name])))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise GrammarFieldError(found[1][0], f"only one output constraint per request; got {names}")
    return found[0][1] if found else None


def _response_format(fmt: Any) -> common_pb2.Grammar | None:
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise GrammarFieldError("response_format", "response_format must be an object with a 'type'")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return common_pb2.Grammar(kind=common_pb2.GRAMMAR_KIND_JSON_OBJECT)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarFieldError("response_format.json_schema",
                                    "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}")  # fmt: skip
        return _schema(spec["schema"], "response_format.json_schema.schema")
    raise GrammarFieldError("response_format.type",
                            f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}")  # fmt: skip


def _extension(name: str, value: Any) -> common_pb2.Grammar:
    kind = ALIASES.get(name, name)
    if kind == "json_schema":
        try:
            return _schema(json.loads(value) if isinstance(value, str) else value, name)
        except ValueError as exc:
            raise GrammarFieldError(name, f"{name} is not JSON: {exc}") from None
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise GrammarFieldError(name, f"{name} must be a non-empty string (a regular expression)")
        return common_pb2.Grammar(kind=common_pb2.GRAMMAR_KIND_REGEX, spec=value)
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise GrammarFieldError(name, f"{name} must be a non-empty list of non-empty strings")
    return common_pb2.Grammar(kind=common_pb2.GRAMMAR_KIND_CHOICE, spec=json.dumps(value))


def _schema(schema: Any, param: str) -> common_pb2.Grammar:
    if not isinstance(schema, (dict, bool)):
        raise GrammarFieldError(param, f"{param} must be a JSON Schema (an object)")
    return common_pb2.Grammar(kind=common_pb2.GRAMMAR_KIND_JSON_SCHEMA, spec=json.dumps(schema))
