"""The bodies the OpenAI-compatible endpoints accept, with every range a client can get wrong (400 otherwise).

Each bound is either OpenAI's (temperature, penalties, top_logprobs, n) or the
wire's (uint32 token counts, int32 priority): a value the protobuf messages
cannot hold is refused here, so no input reaches the scheduler as a crash.
Unknown fields are ignored, except those in ``UNSUPPORTED`` with a
non-neutral value, which are refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

UINT32 = (1 << 32) - 1
INT32 = (1 << 31) - 1
MAX_N = 16  # parallel samples of one prompt
MAX_LOGPROBS = 20
ROLES = ("system", "developer", "user", "assistant", "tool")

# OpenAI fields that would change the answer and that Tandem does not serve: refused, never silently ignored
# (a value equal to the field's neutral default is accepted, as clients often send those).
UNSUPPORTED = {"suffix": (None, ""), "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
               "tool_choice": (None, "none", "auto"), "function_call": (None, "none", "auto"),
               "response_format": (None, {"type": "text"}), "guided_json": (None,), "guided_regex": (None,),
               "guided_choice": (None,), "guided_grammar": (None,)}  # fmt: skip

Finite = Field(allow_inf_nan=False)


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields: ignored, except UNSUPPORTED ones

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=UINT32)  # 0: only with echo (prompt log-probabilities)
    max_completion_tokens: int | None = Field(None, ge=1, le=UINT32)
    stop: str | list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=UINT32)  # -1 or 0: all tokens (vLLM's convention)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=100, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    min_tokens: int = Field(0, ge=0, le=UINT32)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = Field(None, ge=0, lt=1 << 63)
    n: int = Field(1, ge=1, le=MAX_N)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Tandem's extensions
    slo_tpot_ms: float | None = Field(None, gt=0, le=1e9)
    slo_ttft_ms: float | None = Field(None, gt=0, le=1e9)
    speculation: Literal["off", "auto"] | int | None = None
    priority: int = Field(0, ge=-INT32, le=INT32)
    cache_salt: str = Field("", max_length=256)  # prefix-cache tenant (vLLM's): different salts share no KV blocks
    return_tokens_as_token_ids: bool = False  # vLLM's: logprob tokens read "token_id:<id>"
    include_stop_str_in_output: bool = False  # vLLM's: keep the stop string that ended the text

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionBody(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)  # alternatives per token (OpenAI: up to 5)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ...: passed to the template

    role: Literal[ROLES]
    content: str | list[dict[str, Any]] | None = ""


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class TokenizeBody(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeBody(BaseModel):
    model: str | None = None
    tokens: list[int]
