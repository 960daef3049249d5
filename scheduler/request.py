"""The Request: the one unit that flows through queue, policies, loop and metrics.

A request is plain data. The scheduler loop is its only writer; policies and
observers read it. Its token sequence, as the workers see it::

    prompt_ids                      output_ids
    p0 p1 ... p(m-1)   |   o0 (from target prefill)  o1 o2 ...  (from verify steps)

``draft_seen`` counts how much of ``prompt_ids + output_ids`` the draft worker
has been given, so each speculate call sends only ``tokens()[draft_seen:]``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from shared.engine.types import GrammarSpec, SamplingParams, TokenLogprobs
from shared.engine.features import FeatureBlock


class RequestState(enum.Enum):
    WAITING = "waiting"  # queued, or preempted back into the queue
    RUNNING = "running"  # admitted: the target holds its KV cache
    FINISHED = "finished"  # ended normally (length or stop)
    ABORTED = "aborted"  # cancelled by the client
    FAILED = "failed"  # ended by an error; see ``error``

    @property
    def done(self) -> bool:
        return self in (RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED)


class FinishReason(enum.Enum):
    LENGTH = "length"  # max_new_tokens reached
    STOP_TOKEN = "stop_token"  # a token in stop_token_ids (kept in the output)
    STOP_STRING = "stop_string"  # a stop string completed (the completing token is kept)
    ABORTED = "aborted"
    ERROR = "error"


class SpecMode(enum.Enum):
    AUTO = "auto"  # the configured speculation policy decides
    OFF = "off"  # never speculate (the draft never holds this request)
    FIXED = "fixed"  # always a chain of ``k`` tokens, whatever the policy says


@dataclass(frozen=True)
class SpeculationSetting:
    mode: SpecMode = SpecMode.AUTO
    k: int = 0  # chain length for FIXED


@dataclass(frozen=True)
class SLO:
    """Latency objective. TPOT = (t_last - t_first) / (n - 1); TTFT = t_first - arrival."""

    tpot_ms: float | None = None
    ttft_ms: float | None = None


@dataclass
class Request:
    id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_new_tokens: int = 128
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)  # matched via the scheduler's detokenizer
    slo: SLO = field(default_factory=SLO)
    priority: int = 0  # lower value = more urgent (vLLM convention); see FCFS
    speculation: SpeculationSetting = field(default_factory=SpeculationSetting)
    cache_salt: str = ""  # prefix-cache tenant on the model services: different salts never share KV blocks
    # prompt tokens the target's prefix cache likely holds (scheduler/prefix_estimate.py): not charged as prefill
    num_cached_estimate: int = field(default=0, compare=False)
    grammar: GrammarSpec | None = None  # structured output; start = len(prompt_ids)

    # --- lifecycle, written by the scheduler loop -------------------------------------------
    state: RequestState = RequestState.WAITING
    arrival_time: float | None = None  # set by Scheduler.submit from its clock
    first_token_time: float | None = None
    finish_time: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    error_code: str | None = None  # gRPC status name, e.g. "UNAVAILABLE", "OUT_OF_RANGE"

    # --- output ------------------------------------------------------------------------------
    output_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # emit time of every output token
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)  # per output token, when sampling.logprobs
    prompt_logprobs: list[TokenLogprobs] | None = None  # prompt tokens 1.., when sampling.prompt_logprobs

    # --- speculation history (for policies and metrics) --------------------------------------
    accepted_lens: list[int] = field(default_factory=list)  # accepted draft tokens per speculative step
    drafted_depths: list[int] = field(default_factory=list)  # depth of the verified tree per speculative step
    position_drafted: list[int] = field(default_factory=list)  # [depth] steps whose tree reached depth
    position_accepted: list[int] = field(default_factory=list)  # [depth] steps that accepted a node at depth
    num_drafted_tokens: int = 0  # tree nodes sent to verification
    num_accepted_tokens: int = 0  # of which accepted
    attained_service_s: float = 0.0  # its steps' time less their prefill phase (LAPS-SD's E_i, §4.2)
    attained_rounds: int = 0  # the rounds (loop steps) it ran in: E_i counted in rounds (priority_queues.py)
    num_preemptions: int = 0
    num_recomputes: int = 0  # preemptions that released its KV, so it was prefilled again

    # --- worker bookkeeping (scheduler-private) ------------------------------------------------
    on_draft: bool = False  # the draft worker holds this sequence
    resident: bool = False  # preempted but still holding its KV on the target (resumes without a prefill)
    draft_seen: int = 0  # tokens of tokens() the draft has been given
    # tokens the draft holds beyond draft_seen (an optimistic frontier chunk, FASER §4.3) that the next speculate
    # call rolls back (SpecItem.rollback); 0 whenever the draft's copy is released or re-prefilled
    draft_rollback: int = 0
    # target features held for a feature-level draft until its next call (scheduler/feature_relay.py)
    features: FeatureBlock | None = field(default=None, repr=False)

    # --- derived -----------------------------------------------------------------------------
    @property
    def num_generated(self) -> int:
        return len(self.output_ids)

    @property
    def num_remaining(self) -> int:
        return self.max_new_tokens - len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def tokens_from(self, start: int) -> list[int]:
        """``tokens()[start:]`` without copying the rest (a speculate call's new tokens, every step)."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n :]
        return self.prompt_ids[start:] + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def draft_lag(self) -> int:
        """Tokens the draft must be fed before it can speculate for this request (Nightjar's L_i, §4.2): all but the
        last when it does not hold the sequence (a re-prefill), else those since its last speculate call; the last
        token always goes in with the speculate call itself."""
        if not self.on_draft:
            return max(0, self.num_tokens - 1)
        return max(0, self.num_tokens - self.draft_seen - 1)

    @property
    def ttft(self) -> float | None:
        """Seconds from arrival to the first token."""
        if self.first_token_time is None or self.arrival_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first: (t_last - t_first) / (n - 1); None for n < 2."""
        n = len(self.token_times)
        if n < 2:
            return None
        return (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens over the request's life; None before its first speculation."""
        if self.num_drafted_tokens == 0:
            return None
        return self.num_accepted_tokens / self.num_drafted_tokens

    def acceptance_rates(self) -> list[float]:
        """Cumulative acceptance rate after each speculative round: accepted / drafted depth so far.

        Per position of a chain (or path of a tree), so n·rate + 1 is the expected
        number of tokens a round of depth n emits (LAPS-SD eq. 6's A_i).
        """
        rates, acc, drafted = [], 0, 0
        for a, d in zip(self.accepted_lens, self.drafted_depths):
            acc, drafted = acc + a, drafted + d
            rates.append(acc / drafted if drafted else 0.0)
        return rates

    @property
    def mean_accepted_len(self) -> float | None:
        if not self.accepted_lens:
            return None
        return sum(self.accepted_lens) / len(self.accepted_lens)

    def meets_slo(self) -> bool | None:
        """TPOT (and TTFT where set) within the SLO; None when there is no TPOT SLO or too few tokens."""
        if self.slo.tpot_ms is None or self.tpot is None:
            return None
        ok = self.tpot * 1e3 <= self.slo.tpot_ms
        if self.slo.ttft_ms is not None and self.ttft is not None:
            ok = ok and self.ttft * 1e3 <= self.slo.ttft_ms
        return ok


def validate_request(req: Request, *, max_total_tokens: int | None = None) -> None:
    """Raise ``ValueError`` naming the bad field; the services map it to INVALID_ARGUMENT."""
    if not isinstance(req.id, str) or not req.id:
        raise ValueError("request id must be a non-empty string")
    if not req.prompt_ids:
        raise ValueError(f"request {req.id}: prompt is empty; at least one prompt token is required")
    if any((not isinstance(t, int)) or t < 0 for t in req.prompt_ids):
        raise ValueError(f"request {req.id}: prompt token ids must be non-negative integers")
    if not isinstance(req.max_new_tokens, int) or req.max_new_tokens < 1:
        raise ValueError(f"request {req.id}: max_new_tokens must be an integer >= 1, got {req.max_new_tokens!r}")
    if max_total_tokens is not None and len(req.prompt_ids) + req.max_new_tokens > max_total_tokens:
        raise ValueError(
            f"request {req.id}: prompt ({len(req.prompt_ids)} tokens) + max_new_tokens ({req.max_new_tokens}) "
            f"exceeds the scheduler's limit of {max_total_tokens} tokens in flight"
        )
    s = req.sampling
    if not _finite(s.temperature) or s.temperature < 0:
        raise ValueError(f"request {req.id}: temperature must be a finite number >= 0, got {s.temperature!r}")
    if not _finite(s.top_p) or not (0.0 < s.top_p <= 1.0):
        raise ValueError(f"request {req.id}: top_p must be in (0, 1], got {s.top_p!r}")
    if s.seed is not None and (not isinstance(s.seed, int) or s.seed < 0):
        raise ValueError(f"request {req.id}: seed must be a non-negative integer or unset, got {s.seed!r}")
    for name, value in (("tpot_ms", req.slo.tpot_ms), ("ttft_ms", req.slo.ttft_ms)):
        if value is not None and (not _finite(value) or value <= 0):
            raise ValueError(f"request {req.id}: SLO {name} must be a finite number > 0 or unset, got {value!r}")
    if any((not isinstance(t, int)) or t < 0 for t in req.stop_token_ids):
        raise ValueError(f"request {req.id}: stop token ids must be non-negative integers")
    if any((not isinstance(s_, str)) or not s_ for s_ in req.stop_strings):
        raise ValueError(f"request {req.id}: stop strings must be non-empty strings")
    spec = req.speculation
    if spec.mode is SpecMode.FIXED and (not isinstance(spec.k, int) or spec.k < 1):
        raise ValueError(f"request {req.id}: speculation mode FIXED needs k >= 1, got k={spec.k!r}")
    if spec.mode is not SpecMode.FIXED and spec.k != 0:
        raise ValueError(f"request {req.id}: speculation k is only meaningful with mode FIXED (got k={spec.k})")
    if not isinstance(req.priority, int):
        raise ValueError(f"request {req.id}: priority must be an integer, got {req.priority!r}")


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
