"""The SDK's arguments -> one ``GenerateRequest`` (tandem.proto), every value checked before any call.

The checks are the server's own ranges (``sdk.types.Sampling`` mirrors shared/engine/sampling_checks.py and
services/scheduler/translate.py), so a bad value raises ``InvalidRequestError`` naming the field without a
round trip; what only the server can know (vocabulary, context window, tokenizer) it checks itself.

``n`` parallel samples are not a field of the request: ``sample_requests`` makes n requests of one prompt
(``Client.samples`` sends them at once), exactly as the HTTP API's ``n`` does: sample i draws with seed
``sample_seed(seed, i)`` and carries request id ``<id>-i``, so one seed gives the same n samples on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import ValidationError

from sdk.errors import InvalidRequestError
from sdk.types import ChatMessage, Sampling, Speculation
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2
from shared.rpc.grammar_fields import GrammarFieldError, grammar_of
from shared.rpc.sample_seed import sample_seed

Prompt = str | Sequence[int] | Sequence[ChatMessage | dict]  # text, token ids, or a conversation
SpeculationArg = Speculation | Literal["auto", "off"] | int | dict | None

_SPEC_MODE = {
    "auto": tandem_pb2.SPECULATION_MODE_AUTO,
    "off": tandem_pb2.SPECULATION_MODE_OFF,
    "fixed": tandem_pb2.SPECULATION_MODE_FIXED,
}


def build_request(
    prompt: Prompt,
    *,
    max_new_tokens: int = 128,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    ignore_eos: bool = False,
    sampling: Sampling | dict | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    min_tokens: int | None = None,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
    slo_tpot_ms: float | None = None,
    slo_ttft_ms: float | None = None,
    priority: int = 0,
    speculation: SpeculationArg = None,
    request_id: str | None = None,
    cache_salt: str = "",
    response_format: dict | None = None,
    json_schema: dict | None = None,
    regex: str | None = None,
    choice: Sequence[str] | None = None,
) -> tandem_pb2.GenerateRequest:
    """The GenerateRequest for these arguments; bad values raise InvalidRequestError before any call.

    Sampling: ``sampling`` (a ``Sampling`` or its dict), each field overridable by the keyword of its name
    (temperature, top_p, seed, top_k, min_p, repetition_penalty, frequency_penalty, presence_penalty,
    min_tokens, logprobs, prompt_logprobs; None keeps ``sampling``'s). ``logprobs=k`` returns each output token's
    log-probability with k alternatives (0..20) in ``GenerateResult.logprobs`` / ``TokenEvent.logprobs``.
    ``ignore_eos``: the model's end-of-sequence token does not end the request. Structured output, at most one
    of: ``response_format`` (OpenAI's), ``json_schema``, ``regex``, ``choice``."""
    given = dict(temperature=temperature, top_p=top_p, seed=seed, top_k=top_k, min_p=min_p,
                 repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                 presence_penalty=presence_penalty, min_tokens=min_tokens, logprobs=logprobs,
                 prompt_logprobs=prompt_logprobs)  # fmt: skip
    params = _sampling(sampling, {k: v for k, v in given.items() if v is not None})
    spec = _speculation(speculation)
    if max_new_tokens < 1:
        raise InvalidRequestError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if params.min_tokens > max_new_tokens:
        raise InvalidRequestError(f"sampling.min_tokens ({params.min_tokens}) exceeds max_new_tokens "
                                  f"({max_new_tokens})")  # fmt: skip
    if slo_tpot_ms is not None and slo_tpot_ms <= 0 or slo_ttft_ms is not None and slo_ttft_ms <= 0:
        raise InvalidRequestError("SLO targets must be positive milliseconds")

    request = tandem_pb2.GenerateRequest(
        request_id=request_id or "",
        max_new_tokens=max_new_tokens,
        stop=list(stop),
        stop_token_ids=list(stop_token_ids),
        ignore_eos=ignore_eos,
        priority=priority,
        cache_salt=cache_salt,  # prefix-cache tenant: requests of different salts never share KV blocks
    )
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequestError("prompt is empty")
        request.text = prompt
    elif _is_chat(prompt):
        request.chat.CopyFrom(_chat_pb(prompt))
    else:
        ids = list(prompt)
        if not ids or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise InvalidRequestError("token_ids prompt must be a non-empty list of non-negative ints")
        request.token_ids.ids.extend(ids)
    request.sampling.CopyFrom(sampling_pb(params))
    if slo_tpot_ms is not None:
        request.slo.tpot_ms = slo_tpot_ms
    if slo_ttft_ms is not None:
        request.slo.ttft_ms = slo_ttft_ms
    if spec is not None:
        request.speculation.mode = _SPEC_MODE[spec.mode]
        request.speculation.k = spec.k
    try:
        grammar = grammar_of({"response_format": response_format, "guided_json": json_schema, "regex": regex,
                              "choice": list(choice) if choice is not None else None})  # fmt: skip
    except GrammarFieldError as exc:
        raise InvalidRequestError(str(exc).replace("guided_json", "json_schema")) from None
    if grammar is not None:
        request.grammar.CopyFrom(grammar)
    return request


def sample_requests(prompt: Prompt, n: int, **kwargs) -> list[tandem_pb2.GenerateRequest]:
    """The n requests of n samples of ``prompt`` (keywords: see ``build_request``); sample 0 is the request itself."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidRequestError(f"n must be an integer >= 1, got {n!r}")
    request = build_request(prompt, **kwargs)
    out = []
    for i in range(n):
        one = tandem_pb2.GenerateRequest()
        one.CopyFrom(request)
        if request.request_id and n > 1:
            one.request_id = f"{request.request_id}-{i}"
        if request.sampling.HasField("seed"):
            one.sampling.seed = sample_seed(request.sampling.seed, i)
        out.append(one)
    return out


def sampling_pb(params: Sampling) -> common_pb2.SamplingParams:
    """The wire's SamplingParams; neutral values stay unset (optional fields) or zero, as the server reads them."""
    msg = common_pb2.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, min_p=params.min_p,
        frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty,
        min_tokens=params.min_tokens,
    )  # fmt: skip
    if params.repetition_penalty != 1.0:
        msg.repetition_penalty = params.repetition_penalty
    for name in ("seed", "logprobs", "prompt_logprobs"):
        if getattr(params, name) is not None:
            setattr(msg, name, getattr(params, name))
    return msg


def _sampling(sampling: Sampling | dict | None, overrides: dict) -> Sampling:
    try:
        base = sampling.model_dump() if isinstance(sampling, Sampling) else dict(sampling or {})
        return Sampling.model_validate({**base, **overrides})
    except ValidationError as exc:
        raise InvalidRequestError(_problem(exc, "sampling")) from None
    except (TypeError, ValueError) as exc:  # e.g. a sampling argument that is not a mapping
        raise InvalidRequestError(f"sampling must be a Sampling or a dict of its fields: {exc}") from None


def _problem(exc: ValidationError, what: str) -> str:
    """The first error as ``sampling.top_k: Input should be greater than or equal to 0 (-1)``."""
    err = exc.errors(include_url=False)[0]
    field = ".".join(str(part) for part in err.get("loc", ()))
    where = f"{what}.{field}" if field else what
    given = f" ({err['input']!r})" if field and "input" in err else ""
    return f"{where}: {err['msg']}{given}"


def _speculation(arg: SpeculationArg) -> Speculation | None:
    if arg is None or isinstance(arg, Speculation):
        return arg
    if isinstance(arg, bool):
        raise InvalidRequestError("speculation must be 'auto', 'off', k (int) or a Speculation")
    try:
        if isinstance(arg, int):
            return Speculation(mode="off") if arg == 0 else Speculation(mode="fixed", k=arg)
        if isinstance(arg, str):
            return Speculation(mode=arg)
        return Speculation.model_validate(arg)
    except ValidationError as exc:
        raise InvalidRequestError(_problem(exc, "speculation")) from None


def _is_chat(prompt: Prompt) -> bool:
    return bool(prompt) and isinstance(prompt[0], (ChatMessage, dict))


def _chat_pb(messages: Sequence[ChatMessage | dict]) -> tandem_pb2.ChatMessages:
    try:
        parsed = [m if isinstance(m, ChatMessage) else ChatMessage.model_validate(m) for m in messages]
    except ValidationError as exc:
        raise InvalidRequestError(f"chat message: {exc.errors(include_url=False)[0]['msg']}") from exc
    return tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(role=m.role, content=m.content) for m in parsed])
