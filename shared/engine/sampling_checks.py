"""The checks every ``SamplingParams`` passes before it is used (no torch: the scheduler runs them too)."""

from __future__ import annotations

import math
import numbers

from shared.engine.errors import InvalidRequestError
from shared.engine.types import SamplingParams

MAX_LOGPROBS = 20  # alternatives one token may report (OpenAI's top_logprobs bound)


def validate_sampling(params: SamplingParams) -> None:
    """Raise ``InvalidRequestError`` unless the sampling values are usable."""
    t = params.temperature
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise InvalidRequestError(f"temperature must be a number, got {t!r}")
    if math.isnan(t) or math.isinf(t) or t < 0:
        raise InvalidRequestError(f"temperature must be finite and >= 0 (0 means greedy), got {t}")
    top_p = params.top_p
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
        raise InvalidRequestError(f"top_p must be a number, got {top_p!r}")
    if math.isnan(top_p) or not (0.0 < top_p <= 1.0):
        raise InvalidRequestError(f"top_p must be in (0, 1], got {top_p}")
    _check_range(params.top_k, "top_k", 0, None, integral=True)
    _check_range(params.min_p, "min_p", 0.0, 1.0)
    if _check_range(params.repetition_penalty, "repetition_penalty", 0.0, None) <= 0.0:
        raise InvalidRequestError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    _check_range(params.frequency_penalty, "frequency_penalty", -2.0, 2.0)
    _check_range(params.presence_penalty, "presence_penalty", -2.0, 2.0)
    _check_range(params.min_tokens, "min_tokens", 0, None, integral=True)
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name) is not None:
            _check_range(getattr(params, name), name, 0, MAX_LOGPROBS, integral=True)
    seed = params.seed
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise InvalidRequestError(f"seed must be an integer or None, got {seed!r}")
        if not (0 <= seed < 2**64):
            raise InvalidRequestError(f"seed must be in [0, 2**64), got {seed}")


def _check_range(value, name: str, low, high, *, integral: bool = False):
    """``value`` must be a (finite, integral where asked) number in [low, high]; returns it."""
    kind = numbers.Integral if integral else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind) or (not integral and math.isnan(value)):
        raise InvalidRequestError(f"{name} must be {'an integer' if integral else 'a number'}, got {value!r}")
    if value < low or (high is not None and value > high) or (not integral and math.isinf(value)):
        raise InvalidRequestError(f"{name} must be in [{low}, {'inf' if high is None else high}], got {value}")
    return value
