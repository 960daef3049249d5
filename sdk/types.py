"""The SDK's public data types: what a request asks for and what comes back (no gRPC, no client code).

``sdk.client`` builds and parses protobuf messages from and into these;
``sdk.errors`` refers to ``GenerateResult``. Both import this module, never
each other's types.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FinishReason(StrEnum):
    LENGTH = "length"
    STOP = "stop"
    EOS = "eos"
    ABORTED = "aborted"
    ERROR = "error"
    UNSPECIFIED = "unspecified"


class ChatMessage(BaseModel):
    """One turn of a conversation; a list of them is a prompt the server renders with the model's chat template."""

    role: Literal["system", "user", "assistant"] | str = Field(description="system, user or assistant.")
    content: str


UINT32 = (1 << 32) - 1  # the wire's token counts (common.proto SamplingParams)
MAX_LOGPROBS = 20  # alternatives one token may report (the server's bound, OpenAI's top_logprobs)


class Sampling(BaseModel):
    """How the target picks tokens (common.proto SamplingParams); every default is neutral, temperature 0 is greedy.

    The ranges are the server's (shared/engine/sampling_checks.py), so a value outside them fails here, before
    any call. Order of action on the server: min_tokens mask, repetition penalty, frequency and presence
    penalties, then / temperature, softmax, top-k, top-p, min-p. ``logprobs`` / ``prompt_logprobs`` ask for
    the target's log-probabilities of each output / prompt token with that many alternatives (None: none).
    """

    model_config = ConfigDict(extra="forbid")  # a misspelt field fails instead of sampling with its default

    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False, description="Softmax temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(None, ge=0, lt=1 << 64, description="Seed for reproducible sampling.")
    top_k: int = Field(0, ge=0, le=UINT32, description="Keep the k most probable tokens; 0 means all.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Drop tokens below min_p x the most probable's probability.")
    repetition_penalty: float = Field(1.0, gt=0.0, allow_inf_nan=False, description="CTRL's penalty on tokens of "
                                      "the prompt and output (logit / r, x r when negative); 1 means none.")
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Minus this per occurrence in the output.")
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="Minus this once a token occurs in the output.")
    min_tokens: int = Field(0, ge=0, le=UINT32, description="No stop token (EOS included) before this many tokens.")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="Report each output token's "
                                 "log-probability and this many alternatives; None: none.")
    prompt_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="The same for the prompt's "
                                        "tokens (all but the first, which nothing predicts).")


class Speculation(BaseModel):
    """How much to speculate: the server's policy (auto), none (off), or a fixed chain of k tokens."""

    mode: Literal["auto", "off", "fixed"] = "auto"
    k: int = Field(0, ge=0, description="Chain length for mode=fixed.")

    @model_validator(mode="after")
    def _fixed_needs_k(self) -> "Speculation":
        if self.mode == "fixed" and self.k < 1:
            raise ValueError("speculation mode 'fixed' needs k >= 1")
        return self


class AcceptanceStats(BaseModel):
    num_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    mean_accepted_length: float = 0.0
    acceptance_rate: float = 0.0


class Timing(BaseModel):
    queue_ms: float = 0.0
    forward_ms: float = 0.0
    total_ms: float = 0.0
    start_unix_ns: int = 0


class TopLogprob(BaseModel):
    """One alternative the target considered for a position."""

    token_id: int
    logprob: float


class TokenLogprob(BaseModel):
    """The target's log-probability of one token (common.proto TokenLogprobs), from the distribution it was drawn
    from (after penalties, temperature, top-k, top-p, min-p; greedy: the model's after penalties), never the
    draft's. ``logprob`` is -inf for a token the sampling filters removed. The wire carries token ids, not their
    text: decode them with the model's tokenizer (or the HTTP API's /detokenize)."""

    token_id: int
    logprob: float
    top: list[TopLogprob] = Field(default_factory=list, description="The most probable tokens, most probable first.")


class TokenEvent(BaseModel):
    """Tokens committed in one server iteration."""

    request_id: str
    token_ids: list[int]
    text: str
    timestamps_unix_ns: list[int]
    num_accepted: int = Field(0, description="How many of these were accepted draft tokens.")
    logprobs: list[TokenLogprob] = Field(default_factory=list, description="One per token id (Sampling.logprobs).")
    prompt_logprobs: list[TokenLogprob] = Field(default_factory=list, description="First event only: prompt "
                                                "tokens 1 .. n - 1 (Sampling.prompt_logprobs).")


class GenerateResult(BaseModel):
    """A finished request."""

    request_id: str
    token_ids: list[int] = Field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    error: str = ""
    num_prompt_tokens: int = 0
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    slo_attained: bool = True
    token_timestamps_unix_ns: list[int] = Field(default_factory=list)
    stats: AcceptanceStats = Field(default_factory=AcceptanceStats)
    timing: Timing = Field(default_factory=Timing)
    logprobs: list[TokenLogprob] = Field(default_factory=list, description="One per generated token "
                                         "(Sampling.logprobs); empty when not asked for.")
    prompt_logprobs: list[TokenLogprob] = Field(default_factory=list, description="Prompt tokens 1 .. n - 1 "
                                                "(Sampling.prompt_logprobs); empty when not asked for.")

    @property
    def num_generated(self) -> int:
        return len(self.token_ids)


class ModelInfo(BaseModel):
    role: str = ""
    service_version: str = ""
    model_name: str = ""
    vocab_size: int = 0
    max_context: int = 0
    dtype: str = ""
    device: str = ""
    kv_blocks_total: int = 0
    kv_blocks_free: int = 0
    block_size: int = 0
    num_live_seqs: int = 0
    weights_offloaded: bool = False


class ServerInfo(BaseModel):
    service_version: str = ""
    queue_policy: str = ""
    speculation_policy: str = ""
    num_running: int = 0
    num_waiting: int = 0
    chat_template: bool = Field(False, description="The target's tokenizer has a chat template (chat prompts work).")
    target: ModelInfo | None = None
    draft: ModelInfo | None = None
