"""OpenAI-compatible HTTP API, served by the scheduler process beside its gRPC endpoint (TANDEM_HTTP_PORT).

    POST /v1/completions         prompt (text or token ids) -> text     POST /tokenize     text or messages -> ids
    POST /v1/chat/completions    messages -> the chat template -> text  POST /detokenize   ids -> text
    GET  /v1/models              the served model and its aliases       GET  /metrics      Prometheus text
    GET  /health                 SERVING or 503                         GET  /version      the package version

Why in the scheduler process: a request goes straight into the same ``TandemServicer._generate`` the
gRPC endpoint uses (same checks, limits, queue bound, text decoding, abort on disconnect), with no
extra hop and no second copy of the tokenizer; the API keys are the same (TANDEM_API_KEYS).

Every body field is either honoured or refused with a 400 naming it (http_bodies.py lists the ranges and
the refused fields); docs/http.md has the table. ``n`` samples run as n requests (http_request.py,
http_choices.py). ``X-Request-Id``: a client's id names the request (traces, logs, Abort) and is echoed
back; without one the response carries the generated id. Errors are OpenAI-shaped with the matching
status (RESOURCE_EXHAUSTED -> 429 + Retry-After); no input answers 5xx. An incoming W3C
``traceparent`` header parents the scheduler's spans. Structured output (``response_format``, ``regex``,
``choice``; shared/rpc/grammar_fields.py) runs with speculation on.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import context as otel_context
from opentelemetry.propagate import extract
from pydantic import BaseModel, ValidationError

from services.scheduler.errors import TandemRequestError
from services.scheduler.http_bodies import ChatBody, CompletionBody, DetokenizeBody, TokenizeBody
from services.scheduler.http_choices import Sample, Shape, complete, stream
from services.scheduler.http_errors import ApiError, error_for
from services.scheduler.http_request import generate_requests
from services.scheduler.servicer import TandemServicer
from shared.rpc.api_keys import bearer, key_matches

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:/@+=-]{1,128}$")
OPEN_PATHS = ("/health", "/version", "/metrics")


def build_app(servicer: TandemServicer, *, model_name: str, keys: frozenset[str] = frozenset(),
              ready: Callable[[], bool] = lambda: True, aliases: Sequence[str] = (), version: str = "",
              metrics: Callable[[], tuple[bytes, str]] | None = None) -> FastAPI:  # fmt: skip
    """``metrics``: the Prometheus exposition (body, content type) served on /metrics; None: 404 there."""
    app = FastAPI(title="Tandem (OpenAI-compatible)", docs_url=None, redoc_url=None, openapi_url=None)
    codec = servicer.codec
    names = tuple(dict.fromkeys([model_name, *aliases]))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.middleware("http")
    async def _edges(request: Request, call_next):
        given = request.headers.get("x-request-id")
        if given is not None and not _REQUEST_ID.match(given):
            return ApiError(400, "X-Request-Id must be 1-128 characters of [A-Za-z0-9._:/@+=-]",
                            param="X-Request-Id").response()  # fmt: skip
        request.state.request_id = given
        if keys and not request.url.path.startswith(OPEN_PATHS):
            header = request.headers.get("authorization")
            if not key_matches(bearer(header), keys):
                what = "missing API key" if header is None else "invalid API key"
                return ApiError(401, f"{what}: send 'Authorization: Bearer <key>'", "authentication_error",
                                code="invalid_api_key").response()  # fmt: skip
        try:
            response = await call_next(request)
        except Exception as exc:  # noqa: BLE001 - last resort: a bug answers a JSON 500, never a dropped connection
            response = error_for(exc).response()
        rid = getattr(request.state, "request_id", None)
        if rid:
            response.headers["X-Request-Id"] = rid
        return response

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "SERVING" if ready() else "NOT_SERVING"}, status_code=200 if ready() else 503)

    @app.get("/version")
    async def version_() -> dict:
        return {"version": version or servicer.version}

    @app.get("/metrics")
    async def metrics_() -> Response:
        if metrics is None:
            raise ApiError(404, "this server exports no metrics", code="not_found")
        body, content_type = metrics()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": n, "object": "model", "created": 0, "owned_by": "tandem",
                                            "root": model_name} for n in names]}  # fmt: skip

    def check_model(body: BaseModel) -> str:
        name = getattr(body, "model", None)
        if name is not None and name not in names:
            raise ApiError(404, f"the model {name!r} does not exist; this server serves {', '.join(names)}",
                           param="model", code="model_not_found")  # fmt: skip
        return name or model_name

    def need_codec(what: str):
        if codec is None:
            raise ApiError(400, f"this server has no tokenizer: {what} needs one; send token ids", code="no_tokenizer")
        return codec

    def chat_ids(messages, kwargs: dict | None, add_generation_prompt: bool = True) -> list[int]:
        c = need_codec("a conversation")
        if not c.has_chat_template:
            raise ApiError(400, "this server has no tokenizer with a chat template; use /v1/completions")
        try:
            return c.encode_chat([{"role": m.role, "content": _text(m.content)} for m in messages],
                                 add_generation_prompt=add_generation_prompt, template_kwargs=kwargs)  # fmt: skip
        except TandemRequestError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parse(request, CompletionBody)
        model = check_model(body)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, "one prompt per request (batch prompts are not supported); use n for samples",
                               param="prompt")  # fmt: skip
            prompt = prompt[0]
        if isinstance(prompt, list) and not prompt:
            raise ApiError(400, "prompt is empty", param="prompt")
        if body.max_tokens == 0 and not body.echo:
            raise ApiError(400, "max_tokens 0 needs echo (the prompt's log-probabilities)", param="max_tokens")
        ids = list(prompt) if isinstance(prompt, list) else None
        if body.echo and ids is None:
            ids = need_codec("echo").encode(prompt)
        shape = Shape(chat=False, rid="", created=int(time.time()), model=model, text_of=_text_of(codec, body),
                      logprobs=body.logprobs, hide_output=body.max_tokens == 0)  # fmt: skip
        if body.echo:
            shape.echo_ids = ids
            shape.echo_text = prompt if isinstance(prompt, str) else (codec.decode(ids) if codec else "")
        prompt_lps = body.logprobs if body.echo and body.logprobs is not None else None
        max_tokens = 1 if body.max_tokens == 0 else None
        return await _serve(request, body, shape, "cmpl", lambda rid: generate_requests(
            body, ids, None if ids is not None else prompt, rid, logprobs=body.logprobs, prompt_logprobs=prompt_lps,
            max_tokens=max_tokens))  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _parse(request, ChatBody)
        model = check_model(body)
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        ids = chat_ids(body.messages, body.chat_template_kwargs, body.add_generation_prompt)
        shape = Shape(chat=True, rid="", created=int(time.time()), model=model, text_of=_text_of(codec, body),
                      logprobs=(body.top_logprobs or 0) if body.logprobs else None)  # fmt: skip
        return await _serve(request, body, shape, "chatcmpl", lambda rid: generate_requests(
            body, ids, None, rid, logprobs=shape.logprobs))  # fmt: skip

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict:
        body = await _parse(request, TokenizeBody)
        check_model(body)
        if (body.prompt is None) == (body.messages is None):
            raise ApiError(400, "send exactly one of prompt and messages", param="prompt")
        if body.messages is not None:
            ids = chat_ids(body.messages, body.chat_template_kwargs, body.add_generation_prompt)
        else:
            ids = need_codec("text").encode_plain(body.prompt, body.add_special_tokens)
        return {"count": len(ids), "max_model_len": servicer.limits.max_context, "tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict:
        body = await _parse(request, DetokenizeBody)
        check_model(body)
        vocab = servicer.limits.vocab_size
        if any(not 0 <= t < vocab for t in body.tokens):
            raise ApiError(400, f"tokens must be in [0, {vocab}) (the target's vocabulary)", param="tokens")
        return {"prompt": need_codec("detokenize").decode(body.tokens)}

    async def _serve(request: Request, body, shape: Shape, prefix: str, build):
        shape.stop, shape.keep_stop = body.stop_list, body.include_stop_str_in_output
        rid = request.state.request_id or f"{prefix}-{uuid.uuid4().hex[:24]}"
        request.state.request_id = rid
        shape.rid = rid
        msgs = build(rid)
        ctx = extract(dict(request.headers))  # traceparent: the scheduler's spans join the caller's trace
        samples: list[Sample] = []
        token = otel_context.attach(ctx)  # each request's span is opened at submit, inside its first step
        try:
            for i, msg in enumerate(msgs):
                gen = servicer._generate(msg, final_only=not body.stream)  # a whole answer: read once it ends
                samples.append(Sample(i, gen))
                await gen.__anext__()  # the checks run here: a bad request is an HTTP error, not a stream
        except BaseException as exc:
            for s in samples:
                await s.gen.aclose()
            if isinstance(exc, StopAsyncIteration):
                raise ApiError(500, "the request ended without a result", "server_error") from None
            if isinstance(exc, Exception):
                raise error_for(exc) from None
            raise
        finally:
            otel_context.detach(token)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream(samples, shape, include_usage), media_type="text/event-stream")
        return await complete(samples, shape, request)

    return app


async def _parse(request: Request, cls: type[BaseModel]) -> Any:
    try:
        data = json.loads(await request.body())
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # a lone surrogate ("\ud800") is not text
        return cls.model_validate(data)
    except UnicodeEncodeError:
        raise ApiError(400, "the body's strings must be valid Unicode (it has a lone surrogate)") from None
    except (ValidationError, ValueError, RecursionError) as exc:
        first = exc.errors(include_url=False)[0] if isinstance(exc, ValidationError) else None
        param = ".".join(str(p) for p in first["loc"]) if first else None
        message = f"{param}: {first['msg']}" if first else f"body is not JSON: {exc}"
        raise ApiError(400, message, param=param) from None


def _text_of(codec, body=None) -> Callable[[int], str]:
    if codec is None or (body is not None and body.return_tokens_as_token_ids):
        return lambda token_id: f"token_id:{token_id}"  # vLLM's spelling when there is no tokenizer
    return codec.token_text


def _text(content) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""
