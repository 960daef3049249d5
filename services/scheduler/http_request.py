"""An OpenAI body -> the ``GenerateRequest``s it stands for: one per sample (``n``), each fully specified.

Sample i of a request with ``seed`` s draws with seed ``sample_seed(s, i)`` (shared/rpc/sample_seed.py), so
``seed`` makes all n samples reproducible and no two alike; without a seed
each sample gets its own entropy. The n requests carry the same prompt ids,
so the target's prefix cache (where it has one) shares the prompt's KV blocks
between them; until then each sample runs its own prefill.
"""

from __future__ import annotations

from services.scheduler.http_bodies import UNSUPPORTED, _Common
from services.scheduler.http_errors import ApiError
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2
from shared.rpc.grammar_fields import GrammarFieldError, grammar_of
from shared.rpc.sample_seed import sample_seed

DEFAULT_MAX_TOKENS = 256


def check_unsupported(body: _Common) -> None:
    for name, neutral in UNSUPPORTED.items():
        if name in (body.model_extra or {}) and body.model_extra[name] not in neutral:
            raise ApiError(400, f"'{name}' is not supported by this server", param=name, code="unsupported")
    if body.best_of is not None and body.best_of != body.n:
        raise ApiError(400, "best_of other than n is not supported (every sample is returned)", param="best_of",
                       code="unsupported")  # fmt: skip


def sampling_of(body: _Common, *, logprobs: int | None, prompt_logprobs: int | None) -> common_pb2.SamplingParams:
    sampling = common_pb2.SamplingParams(temperature=1.0 if body.temperature is None else body.temperature)
    if body.top_p is not None:
        sampling.top_p = body.top_p
    if body.top_k is not None and body.top_k > 0:
        sampling.top_k = body.top_k
    for name in ("min_p", "frequency_penalty", "presence_penalty"):
        if getattr(body, name) is not None:
            setattr(sampling, name, getattr(body, name))
    if body.repetition_penalty is not None:
        sampling.repetition_penalty = body.repetition_penalty
    sampling.min_tokens = body.min_tokens
    if logprobs is not None:
        sampling.logprobs = logprobs
    if prompt_logprobs is not None:
        sampling.prompt_logprobs = prompt_logprobs
    return sampling


def generate_requests(body: _Common, prompt_ids: list[int] | None, text: str | None, request_id: str, *,
                      logprobs: int | None = None, prompt_logprobs: int | None = None,
                      max_tokens: int | None = None) -> list[tandem_pb2.GenerateRequest]:  # fmt: skip
    """The n requests of ``body``: ids ``request_id`` (n = 1) or ``request_id-i``."""
    check_unsupported(body)
    try:
        grammar = grammar_of(body.model_extra or {})  # response_format, regex, choice (http_bodies.GRAMMAR_FIELDS)
    except GrammarFieldError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if max_tokens is None:
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    if body.min_tokens > max_tokens:
        raise ApiError(400, f"min_tokens ({body.min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens")
    if any(not 0 <= t <= (1 << 31) - 1 for t in body.stop_token_ids or ()):
        raise ApiError(400, "stop_token_ids must be token ids (non-negative integers)", param="stop_token_ids")
    msg = tandem_pb2.GenerateRequest(
        max_new_tokens=max_tokens, stop=stop, stop_token_ids=body.stop_token_ids or [], ignore_eos=body.ignore_eos,
        sampling=sampling_of(body, logprobs=logprobs, prompt_logprobs=prompt_logprobs), priority=body.priority,
        cache_salt=body.cache_salt,
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
        elif not 1 <= body.speculation <= 1024:
            raise ApiError(400, "speculation must be 'off', 'auto' or a chain length k >= 1", param="speculation")
        else:
            msg.speculation.mode, msg.speculation.k = tandem_pb2.SPECULATION_MODE_FIXED, int(body.speculation)
    out = []
    for i in range(body.n):
        one = tandem_pb2.GenerateRequest()
        one.CopyFrom(msg)
        one.request_id = request_id if body.n == 1 else f"{request_id}-{i}"
        if body.seed is not None:
            one.sampling.seed = sample_seed(body.seed, i)
        out.append(one)
    return out
