"""GenerateRequest (wire) -> Request (scheduler), with every check the public endpoint owes its clients.

Checks run before anything is queued, so a bad request costs the caller a
status and nobody else anything. That matters most for token ids: draft and
target prefill new requests in batches, and one out-of-vocabulary id would
fail the whole batch.

    field                      rule                                   status
    prompt                     text, token_ids or chat, not empty     INVALID_ARGUMENT
    text prompt / stop strings need a tokenizer                       FAILED_PRECONDITION
    chat prompt                needs a chat template                  FAILED_PRECONDITION
                               roles and contents the template takes  INVALID_ARGUMENT
    token ids                  0 <= id < target vocab                 INVALID_ARGUMENT
    prompt + max_new_tokens    <= target max_context                  OUT_OF_RANGE
    max_new_tokens             >= 1                                   INVALID_ARGUMENT
    sampling                   temperature >= 0, top_p in (0, 1],     INVALID_ARGUMENT
                               top_k >= 0, min_p in [0, 1], repetition
                               > 0, frequency / presence in [-2, 2],
                               min_tokens <= max_new_tokens, logprobs
                               and prompt_logprobs <= 20
    slo                        tpot_ms >= 0 (0: none), ttft_ms > 0    INVALID_ARGUMENT
    sizes (Limits.check_size)  prompt bytes/tokens, stop strings and   INVALID_ARGUMENT, naming the
                               ids, max_new_tokens under the caps      TANDEM_* variable
    speculation                FIXED needs 1 <= k <= max_spec_k       INVALID_ARGUMENT

Two conventions differ between the wire and the scheduler: the wire's
priority is "higher runs earlier", the scheduler's "lower value is more
urgent" (vLLM's), so the sign flips here; and the model's end-of-sequence
token joins the request's stop ids, so generation ends where the model says
(unless ``ignore_eos``); those stop ids are what ``min_tokens`` holds back.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from scheduler.request import SLO, Request, SpecMode, SpeculationSetting, validate_request
from services.scheduler.errors import NoTokenizerError, PromptTooLongError, TandemRequestError
from services.scheduler.text import TextCodec
from shared.engine.errors import InvalidRequestError
from shared.engine.sampling_checks import validate_sampling
from shared.engine.types import SamplingParams
from shared.rpc.gen.tandem.v1 import tandem_pb2

_SPEC_MODES = {
    tandem_pb2.SPECULATION_MODE_UNSPECIFIED: SpecMode.AUTO,
    tandem_pb2.SPECULATION_MODE_AUTO: SpecMode.AUTO,
    tandem_pb2.SPECULATION_MODE_OFF: SpecMode.OFF,
    tandem_pb2.SPECULATION_MODE_FIXED: SpecMode.FIXED,
}


@dataclass(frozen=True)
class Limits:
    """What one request may carry: the models' bounds (from the target's Info) and the operator's caps.

    The caps (TANDEM_MAX_PROMPT_BYTES, ..._PROMPT_TOKENS, ..._NEW_TOKENS, ..._STOP_STRINGS, ..._STOP_CHARS,
    ..._STOP_TOKEN_IDS) bound what a single client can make the server hold or scan; None = only the context window bounds them.
    """

    vocab_size: int
    max_context: int
    max_spec_k: int = 32  # the draft engine's longest chain
    max_prompt_bytes: int = 1 << 20
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    max_stop_strings: int = 16
    max_stop_chars: int = 256
    max_stop_token_ids: int = 64

    def check_size(self, msg: tandem_pb2.GenerateRequest) -> None:
        """Raises TandemRequestError naming the limit (and its variable) that ``msg`` exceeds; before tokenising."""
        if msg.WhichOneof("prompt") == "text" and len(msg.text.encode("utf-8", "surrogatepass")) > self.max_prompt_bytes:
            raise _over("prompt text", f"{self.max_prompt_bytes} bytes", "MAX_PROMPT_BYTES")
        if len(msg.stop) > self.max_stop_strings:
            raise _over(f"stop ({len(msg.stop)} strings)", f"{self.max_stop_strings} strings", "MAX_STOP_STRINGS")
        if any(len(s) > self.max_stop_chars for s in msg.stop):
            raise _over("a stop string", f"{self.max_stop_chars} characters", "MAX_STOP_CHARS")
        if len(msg.stop_token_ids) > self.max_stop_token_ids:
            raise _over(f"stop_token_ids ({len(msg.stop_token_ids)})", f"{self.max_stop_token_ids} ids",
                        "MAX_STOP_TOKEN_IDS")
        if self.max_new_tokens is not None and msg.max_new_tokens > self.max_new_tokens:  # else: the context check
            raise _over(f"max_new_tokens ({msg.max_new_tokens})", f"{self.max_new_tokens}", "MAX_NEW_TOKENS")

    def check_prompt(self, num_tokens: int) -> None:
        if self.max_prompt_tokens is not None and num_tokens > self.max_prompt_tokens:  # else: the context check
            raise _over(f"prompt ({num_tokens} tokens)", f"{self.max_prompt_tokens} tokens", "MAX_PROMPT_TOKENS")


def _over(what: str, limit: str, variable: str) -> TandemRequestError:
    return TandemRequestError(f"{what} exceeds the server's limit of {limit} (TANDEM_{variable})")


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:16]}"


def to_request(msg: tandem_pb2.GenerateRequest, limits: Limits, codec: TextCodec | None) -> Request:
    """The scheduler Request for ``msg``; raises a TandemRequestError naming the bad field."""
    request_id = msg.request_id or new_request_id()
    limits.check_size(msg)
    prompt_ids = _prompt(msg, codec)
    limits.check_prompt(len(prompt_ids))
    _check_ids(prompt_ids, limits, "prompt token ids")
    _check_ids(list(msg.stop_token_ids), limits, "stop_token_ids")
    if msg.stop and codec is None:
        raise NoTokenizerError("stop strings need a tokenizer and this server has none; use stop_token_ids")
    if msg.max_new_tokens < 1:
        raise TandemRequestError("max_new_tokens must be at least 1")
    total = len(prompt_ids) + msg.max_new_tokens
    if total > limits.max_context:
        raise PromptTooLongError(
            f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({msg.max_new_tokens}) = {total} tokens "
            f"exceeds the target's context window of {limits.max_context}"
        )
    eos_ids = () if msg.ignore_eos or codec is None else codec.eos_token_ids
    stop_ids = list(dict.fromkeys([*msg.stop_token_ids, *eos_ids]))
    request = Request(
        id=request_id,
        prompt_ids=prompt_ids,
        sampling=_sampling(msg, tuple(stop_ids)),
        max_new_tokens=msg.max_new_tokens,
        stop_token_ids=stop_ids,
        stop_strings=list(msg.stop),
        slo=_slo(msg),
        priority=-msg.priority,
        speculation=_speculation(msg, limits),
        cache_salt=msg.cache_salt,
    )
    try:
        validate_request(request)
    except ValueError as exc:  # the scheduler's own checks, in its words
        raise TandemRequestError(str(exc)) from None
    return request


def _prompt(msg: tandem_pb2.GenerateRequest, codec: TextCodec | None) -> list[int]:
    kind = msg.WhichOneof("prompt")
    if kind is None:
        raise TandemRequestError("prompt is required: set text, token_ids or chat")
    if kind == "token_ids":
        ids = list(msg.token_ids.ids)
    elif kind == "chat":
        if not msg.chat.messages:
            raise TandemRequestError("chat prompt has no messages")
        if codec is None:
            raise NoTokenizerError("this server has no tokenizer; send the prompt as token_ids")
        ids = codec.encode_chat([{"role": m.role, "content": m.content} for m in msg.chat.messages])
    else:
        if not msg.text:
            raise TandemRequestError("prompt is empty")
        if codec is None:
            raise NoTokenizerError("this server has no tokenizer; send the prompt as token_ids")
        ids = codec.encode(msg.text)
    if not ids:
        raise TandemRequestError("prompt is empty: at least one prompt token is required")
    return ids


def _check_ids(ids: list[int], limits: Limits, what: str) -> None:
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise TandemRequestError(f"{what} must be in [0, {limits.vocab_size}) (the target's vocabulary); got {bad[:5]}")


def _sampling(msg: tandem_pb2.GenerateRequest, stop_ids: tuple[int, ...]) -> SamplingParams:
    s = msg.sampling
    temperature = s.temperature
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not math.isfinite(temperature) or temperature < 0:
        raise TandemRequestError(f"sampling.temperature must be a finite number >= 0, got {temperature}")
    if not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
        raise TandemRequestError(f"sampling.top_p must be in (0, 1], got {top_p}")
    if s.min_tokens > msg.max_new_tokens:
        raise TandemRequestError(f"sampling.min_tokens ({s.min_tokens}) exceeds max_new_tokens ({msg.max_new_tokens})")
    params = SamplingParams(
        temperature=temperature, top_p=top_p, seed=s.seed if s.HasField("seed") else None, top_k=s.top_k,
        min_p=s.min_p, repetition_penalty=s.repetition_penalty if s.HasField("repetition_penalty") else 1.0,
        frequency_penalty=s.frequency_penalty, presence_penalty=s.presence_penalty, min_tokens=s.min_tokens,
        stop_token_ids=stop_ids if s.min_tokens else (), logprobs=s.logprobs if s.HasField("logprobs") else None,
        prompt_logprobs=s.prompt_logprobs if s.HasField("prompt_logprobs") else None,
    )  # fmt: skip
    try:
        validate_sampling(params)  # the engine's own checks, before anything is queued
    except InvalidRequestError as exc:
        raise TandemRequestError(f"sampling.{exc}") from None
    return params


def _slo(msg: tandem_pb2.GenerateRequest) -> SLO:
    tpot, ttft = msg.slo.tpot_ms, (msg.slo.ttft_ms if msg.slo.HasField("ttft_ms") else None)
    if not math.isfinite(tpot) or tpot < 0:
        raise TandemRequestError(f"slo.tpot_ms must be >= 0 ms (0: best effort), got {tpot}")
    if ttft is not None and (not math.isfinite(ttft) or ttft <= 0):
        raise TandemRequestError(f"slo.ttft_ms must be > 0 ms when set, got {ttft}")
    return SLO(tpot_ms=tpot or None, ttft_ms=ttft)


def _speculation(msg: tandem_pb2.GenerateRequest, limits: Limits) -> SpeculationSetting:
    mode = _SPEC_MODES.get(msg.speculation.mode)
    if mode is None:
        raise TandemRequestError(f"unknown speculation mode {msg.speculation.mode}")
    if mode is not SpecMode.FIXED:
        return SpeculationSetting(mode)  # k is ignored outside FIXED (proto contract)
    k = msg.speculation.k
    if not 1 <= k <= limits.max_spec_k:
        raise TandemRequestError(f"speculation FIXED needs 1 <= k <= {limits.max_spec_k}, got k={k}")
    return SpeculationSetting(mode, k)
