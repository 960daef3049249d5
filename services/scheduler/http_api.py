"""OpenAI-compatible HTTP API, served by the scheduler process beside its gRPC endpoint (TANDEM_HTTP_PORT).

    POST /v1/completions         prompt (text or token ids) -> text
    POST /v1/chat/completions    messages -> the target tokenizer's chat template -> text
    GET  /v1/models              the served model      GET /health   SERVING or 503

Why in the scheduler process: a request goes straight into the same ``TandemServicer._generate`` the
gRPC endpoint uses (same checks, limits, queue bound, text decoding, abort on disconnect), with no
extra hop and no second copy of the tokenizer; the API keys are the same (TANDEM_API_KEYS).

Options: ``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed``, ``stream`` (SSE, ``data: [DONE]``)
with ``stream_options.include_usage``; ``n`` > 1 is refused (400). Tandem's extensions in the body:
``slo_tpot_ms``, ``slo_ttft_ms``, ``speculation`` ("off" | "auto" | k), ``priority``. Structured output:
``response_format`` (json_object, json_schema) and the extensions ``regex`` and ``choice``
(shared/rpc/grammar_fields.py), with speculation on. ``usage`` carries
``tandem``: ttft_ms, tpot_ms, num_steps, num_draft_tokens, num_accepted_tokens, acceptance_rate,
mean_accepted_length. Errors are OpenAI-shaped (``{"error": {message, type, param, code}}``) with the
matching HTTP status (RESOURCE_EXHAUSTED -> 429 + Retry-After). A client that disconnects aborts its
request. An incoming W3C ``traceparent`` header parents the scheduler's spans.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry import context as otel_context
from opentelemetry.propagate import extract
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.scheduler.errors import TandemRequestError
from shared.rpc.grammar_fields import GrammarFieldError, grammar_of
from services.scheduler.servicer import TandemServicer
from shared.rpc.api_keys import bearer, key_matches
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2

STATUS = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400, "FAILED_PRECONDITION": 400, "ALREADY_EXISTS": 409,
          "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429, "UNAUTHENTICATED": 401, "UNAVAILABLE": 503,
          "DEADLINE_EXCEEDED": 504}  # fmt: skip
DEFAULT_MAX_TOKENS = 256


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields: ignored, except UNSUPPORTED ones (below)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Tandem's extensions
    slo_tpot_ms: float | None = Field(None, gt=0)
    slo_ttft_ms: float | None = Field(None, gt=0)
    speculation: Literal["off", "auto"] | int | None = None
    priority: int = 0


class CompletionBody(_Common):
    prompt: str | list[int] | list[str]


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = ""


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)


def _error_for(exc: BaseException) -> ApiError:
    code = getattr(exc, "grpc_code", None)
    if code is None:
        return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error")
    headers = {}
    if code == "RESOURCE_EXHAUSTED" and getattr(exc, "retry_after_ms", None):
        headers["Retry-After"] = str(max(1, round(exc.retry_after_ms / 1000)))
    kind = "invalid_request_error" if STATUS.get(code, 500) < 500 else "server_error"
    return ApiError(STATUS.get(code, 500), str(exc), kind, code=code.lower(), headers=headers)


# OpenAI fields that would change the answer and that Tandem does not serve: refused, never silently ignored
# (a value equal to the field's neutral default is accepted, as clients often send those).
UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "echo": (None, False), "best_of": (None, 1),
               "suffix": (None, ""), "logit_bias": (None, {}), "frequency_penalty": (None, 0, 0.0),
               "presence_penalty": (None, 0, 0.0), "tools": (None, []), "functions": (None, [])}  # fmt: skip


def _request(body: _Common, prompt_ids: list[int] | None, text: str | None) -> tandem_pb2.GenerateRequest:
    if body.n != 1:
        raise ApiError(400, "n > 1 is not supported: send one request per choice", param="n", code="unsupported")
    for name, neutral in UNSUPPORTED.items():
        if name in (body.model_extra or {}) and body.model_extra[name] not in neutral:
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported")
    try:
        grammar = grammar_of(body.model_extra or {})
    except GrammarFieldError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    sampling = common_pb2.SamplingParams(temperature=1.0 if body.temperature is None else body.temperature)
    if body.top_p is not None:
        sampling.top_p = body.top_p
    if body.seed is not None:
        sampling.seed = body.seed
    msg = tandem_pb2.GenerateRequest(
        max_new_tokens=body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS, stop=stop,
        sampling=sampling, priority=body.priority,
    )  # fmt: skip
    if grammar is not None:
        msg.grammar.CopyFrom(grammar)
    if prompt_ids is not None:
        msg.token_ids.ids.extend(prompt_ids)
    else:
        msg.text = text or ""
    if body.slo_tpot_ms is not None:
        msg.slo.tpot_ms = body.slo_tpot_ms
    if body.slo_ttft_ms is not None:
        msg.slo.ttft_ms = body.slo_ttft_ms
    if body.speculation is not None:
        if body.speculation == "off":
            msg.speculation.mode = tandem_pb2.SPECULATION_MODE_OFF
        elif body.speculation == "auto":
            msg.speculation.mode = tandem_pb2.SPECULATION_MODE_AUTO
        else:
            msg.speculation.mode, msg.speculation.k = tandem_pb2.SPECULATION_MODE_FIXED, int(body.speculation)
    return msg


def _usage(summary: tandem_pb2.GenerateSummary) -> dict:
    s = summary.stats
    return {
        "prompt_tokens": summary.num_prompt_tokens,
        "completion_tokens": summary.num_generated_tokens,
        "total_tokens": summary.num_prompt_tokens + summary.num_generated_tokens,
        "tandem": {"ttft_ms": round(summary.ttft_ms, 3), "tpot_ms": round(summary.tpot_ms, 3), "num_steps": s.num_steps,
                   "num_draft_tokens": s.num_draft_tokens, "num_accepted_tokens": s.num_accepted_tokens,
                   "acceptance_rate": round(s.acceptance_rate, 4), "mean_accepted_length": round(s.mean_accepted_length, 4),
                   "slo_attained": summary.slo_attained},
    }  # fmt: skip


def _finish(summary: tandem_pb2.GenerateSummary) -> str:
    name = tandem_pb2.FinishReason.Name(summary.finish_reason)
    return "length" if name.endswith("LENGTH") else "stop"


def build_app(servicer: TandemServicer, *, model_name: str, keys: frozenset[str] = frozenset(),
              ready: Callable[[], bool] = lambda: True) -> FastAPI:  # fmt: skip
    app = FastAPI(title="Tandem (OpenAI-compatible)", docs_url=None, redoc_url=None)
    codec = servicer.codec

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if keys and request.url.path.startswith("/v1/"):
            header = request.headers.get("authorization")
            if not key_matches(bearer(header), keys):
                what = "missing API key" if header is None else "invalid API key"
                return ApiError(401, f"{what}: send 'Authorization: Bearer <key>'", "authentication_error",
                                code="invalid_api_key").response()
        return await call_next(request)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "SERVING" if ready() else "NOT_SERVING"}, status_code=200 if ready() else 503)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "tandem"}]}

    async def _parse(request: Request, cls: type[BaseModel]) -> Any:
        try:
            return cls.model_validate(json.loads(await request.body()))
        except (ValidationError, ValueError) as exc:
            first = exc.errors(include_url=False)[0] if isinstance(exc, ValidationError) else None
            param = ".".join(str(p) for p in first["loc"]) if first else None
            raise ApiError(400, first["msg"] if first else f"body is not JSON: {exc}", param=param) from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionBody)
        if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
            if len(body.prompt) != 1:
                raise ApiError(400, "one prompt per request (batch prompts are not supported)", param="prompt")
            body.prompt = body.prompt[0]
        if isinstance(body.prompt, list):
            msg = _request(body, list(body.prompt), None)
        else:
            msg = _request(body, None, body.prompt)
        return await _serve(request, msg, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _parse(request, ChatBody)
        if codec is None or not codec.has_chat_template:
            raise ApiError(400, "this server has no tokenizer with a chat template; use /v1/completions with token ids")
        messages = [{"role": m.role, "content": _text(m.content)} for m in body.messages]
        try:
            ids = codec.encode_chat(messages)
        except TandemRequestError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        return await _serve(request, _request(body, ids, None), body, chat=True)

    async def _serve(request: Request, msg: tandem_pb2.GenerateRequest, body: _Common, *, chat: bool):
        ctx = extract(dict(request.headers))  # traceparent: the scheduler's spans join the caller's trace
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        msg.request_id = rid
        created = int(time.time())
        gen = servicer._generate(msg)
        token = otel_context.attach(ctx)  # the request's span is opened at submit, inside this first step
        try:
            first = await gen.__anext__()  # the checks run here: a bad request is an HTTP error, not a stream
        except StopAsyncIteration:
            raise ApiError(500, "the request ended without a result", "server_error") from None
        except ApiError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise _error_for(exc) from None
        finally:
            otel_context.detach(token)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(gen, first, rid, created, body, chat, include_usage, request),
                                     media_type="text/event-stream")  # fmt: skip
        return await _complete(gen, first, rid, created, body, chat, request)

    return app


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def _choice(chat: bool, text: str, finish: str | None, delta: bool = False) -> dict:
    if chat:
        key = "delta" if delta else "message"
        return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}
    return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}


async def _complete(gen, first, rid, created, body, chat, request: Request) -> dict:
    text, summary = [], None

    async def drain() -> None:
        nonlocal summary
        async for out in gen:
            kind = out.WhichOneof("event")
            if kind == "tokens":
                text.append(out.tokens.text)
            elif kind == "final":
                summary = out.final

    task = asyncio.ensure_future(drain())
    while not task.done():  # a client that hangs up aborts its request (the generator's close does)
        await asyncio.wait({task}, timeout=0.1)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await gen.aclose()
            raise asyncio.CancelledError
    task.result()
    if summary.error:
        raise ApiError(500, summary.error, "server_error", code="generation_failed")
    obj = "chat.completion" if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": body.model or "tandem",
            "choices": [_choice(chat, "".join(text), _finish(summary))], "usage": _usage(summary)}  # fmt: skip


async def _sse(gen, first, rid, created, body, chat, include_usage, request: Request) -> AsyncIterator[bytes]:
    obj = "chat.completion.chunk" if chat else "text_completion"
    base = {"id": rid, "object": obj, "created": created, "model": body.model or "tandem"}

    def event(payload: dict) -> bytes:
        return f"data: {json.dumps(payload)}\n\n".encode()

    try:
        if chat:
            yield event(base | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "finish_reason": None}]})  # fmt: skip
        async for out in gen:
            kind = out.WhichOneof("event")
            if kind == "tokens" and out.tokens.text:
                yield event(base | {"choices": [_choice(chat, out.tokens.text, None, delta=True)]})
            elif kind == "final":
                summary = out.final
                if summary.error:
                    yield event({"error": {"message": summary.error, "type": "server_error", "code": "generation_failed"}})
                    break
                yield event(base | {"choices": [_choice(chat, "", _finish(summary), delta=True)]})
                if include_usage:
                    yield event(base | {"choices": [], "usage": _usage(summary)})
        yield b"data: [DONE]\n\n"
    finally:
        await gen.aclose()  # a disconnect lands here: closing the generator aborts the request
