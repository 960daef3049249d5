"""The SDK's public data types: what a request asks for and what comes back (no gRPC, no client code).

``sdk.client`` builds and parses protobuf messages from and into these;
``sdk.errors`` refers to ``GenerateResult``. Both import this module, never
each other's types.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, model_validator


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


class Sampling(BaseModel):
    """Sampling parameters; temperature 0 is greedy."""

    temperature: float = Field(0.0, ge=0.0, description="Softmax temperature; 0 means greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int | None = Field(None, ge=0, description="Seed for reproducible sampling.")


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


class TokenEvent(BaseModel):
    """Tokens committed in one server iteration."""

    request_id: str
    token_ids: list[int]
    text: str
    timestamps_unix_ns: list[int]
    num_accepted: int = Field(0, description="How many of these were accepted draft tokens.")


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
