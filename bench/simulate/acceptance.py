"""Acceptance traces: what a real draft got accepted, by prompt kind and position, and sampling from it.

A trace (JSON, written by recorder.py from real runs) holds per prompt kind::

    reached[i]    speculation steps whose position i (0 = first drafted token) the target compared
                  (the draft proposed it and positions 0..i-1 were accepted)
    accepted[i]   of which the token at position i was accepted
    request_rates each request's accepted / drafted tokens (how much requests differ)

so p_i = accepted[i] / reached[i] is the acceptance of position i given that the ones
before it were accepted, and a chain of k drafted tokens accepts a tokens with

    P(a) = p_0 ... p_(a-1) * (1 - p_a)          (a < k; the product alone for a = k)

the distribution the real chains had, at any k up to the recorded one (positions past
it reuse the last measured p). Each simulated request draws a rate from its kind's
``request_rates`` and scales its p_i by rate / kind mean, so easy and hard requests
stay easy and hard (LAPS-SD and FASER read per-request acceptance); the scale is the one
at which a chain of the kind's typical k accepts the drawn rate (``scale_for_rate``: a
chain's rate is a sum of products of p_i, not linear in the scale). A request whose prompt
the trace saw (``prompts``: ``prompt_key`` -> that prompt's own reached/accepted) uses
those p_i instead: greedy decoding makes acceptance a property of the prompt, so a
simulator replaying the recorded prompts must not reshuffle which ones are easy.
The key also names the request's output budget (``replay_key``: ``<prompt>+<max_new_tokens>``):
the same prompt asked for 48 tokens and for 32 generates a different span, whose acceptance
differs; a lookup of a span the trace did not see falls back to every span of that prompt.

Trees (AdaServe's policies) need the chance that the target's token is among the
draft's top w at a position; chains record only the top 1. The simulator assumes
each further candidate catches a share ``1 - SIBLING_MISS`` of the remaining misses:

    P(hit within top w) = 1 - (1 - p_i) * SIBLING_MISS^(w - 1)
"""

from __future__ import annotations

import hashlib
import json
import random
import statistics
from pathlib import Path

from pydantic import BaseModel, Field, PrivateAttr, ValidationError, model_validator

TRACE_VERSION = 1
SIBLING_MISS = 0.7  # an assumption, not a measurement (docs/simulate.md)
ALL = "all"  # the kind every step also counts under; the fallback for kinds a trace lacks


class TraceError(ValueError):
    """An acceptance trace that cannot be used; the message names the file and the problem."""


class Positions(BaseModel):
    reached: list[int] = Field(default_factory=list, description="[position] steps whose target compared it.")
    accepted: list[int] = Field(default_factory=list, description="[position] of which it was accepted.")
    drafted: int = Field(0, ge=0, description="Tokens drafted over all steps (drafted / steps: the typical k).")

    @model_validator(mode="after")
    def _consistent(self) -> Positions:
        if len(self.reached) != len(self.accepted):
            raise ValueError(f"reached has {len(self.reached)} positions, accepted {len(self.accepted)}")
        for i, (r, a) in enumerate(zip(self.reached, self.accepted)):
            if r < 0 or a < 0 or a > r:
                raise ValueError(f"position {i}: accepted {a} of reached {r} (need 0 <= accepted <= reached)")
            if i and r > self.accepted[i - 1]:
                raise ValueError(f"position {i} was reached {r} times but position {i - 1} accepted only "
                                 f"{self.accepted[i - 1]}")  # fmt: skip
        return self

    def add_step(self, num_drafted: int, num_accepted: int) -> None:
        """One chain step: ``num_drafted`` proposed, the first ``num_accepted`` accepted."""
        compared = min(num_accepted + 1, num_drafted)
        self.drafted += num_drafted
        grow = compared - len(self.reached)
        if grow > 0:
            self.reached.extend([0] * grow)
            self.accepted.extend([0] * grow)
        for i in range(compared):
            self.reached[i] += 1
        for i in range(num_accepted):
            self.accepted[i] += 1

    def merge(self, other: Positions) -> None:
        n = max(len(self.reached), len(other.reached))
        self.reached = [_at(self.reached, i) + _at(other.reached, i) for i in range(n)]
        self.accepted = [_at(self.accepted, i) + _at(other.accepted, i) for i in range(n)]
        self.drafted += other.drafted

    def rates(self) -> list[float]:
        """p_i for the positions with data (trailing positions never reached are dropped)."""
        return [a / r for r, a in zip(self.reached, self.accepted) if r > 0]

    @property
    def num_steps(self) -> int:
        return self.reached[0] if self.reached else 0

    @property
    def typical_k(self) -> int:
        """The chain length its steps drafted on average (the positions seen, for traces without ``drafted``)."""
        if self.drafted and self.num_steps:
            return max(1, round(self.drafted / self.num_steps))
        return max(1, len(self.reached))


class PositionCounts(Positions):
    """One prompt kind: its positions, each request's rate, and each recorded prompt's own positions."""

    request_rates: list[float] = Field(default_factory=list, description="Accepted / drafted tokens per request.")
    prompts: dict[str, Positions] = Field(default_factory=dict, description="prompt_key -> that prompt's positions.")

    @model_validator(mode="after")
    def _rates_in_range(self) -> PositionCounts:
        if any(not 0.0 <= x <= 1.0 for x in self.request_rates):
            raise ValueError("request acceptance rates must lie in [0, 1]")
        return self

    def add_prompt_step(self, prompt: str, num_drafted: int, num_accepted: int) -> None:
        self.prompts.setdefault(prompt, Positions()).add_step(num_drafted, num_accepted)


def _at(xs: list[int], i: int) -> int:
    return xs[i] if i < len(xs) else 0


class AcceptanceTrace(BaseModel):
    version: int = TRACE_VERSION
    draft: str = Field(description="The draft that was accepted (pair draft, ngram, suffix, eagle head).")
    target: str = Field(description="The target that verified.")
    source: str = Field("", description="How it was recorded: command, machine, date.")
    kinds: dict[str, PositionCounts] = Field(description="Per prompt kind, plus 'all'.")
    _spans: dict[str, Positions | None] = PrivateAttr(default_factory=dict)  # prompt -> its spans merged

    @model_validator(mode="after")
    def _usable(self) -> AcceptanceTrace:
        if not self.kinds or ALL not in self.kinds:
            raise ValueError(f"a trace needs the kind {ALL!r} (every step) and may add one per prompt kind")
        if self.kinds[ALL].num_steps == 0:
            raise ValueError("the trace recorded no speculation step")
        return self

    def counts(self, kind: str) -> PositionCounts:
        c = self.kinds.get(kind)
        return c if c is not None and c.num_steps > 0 else self.kinds[ALL]

    def prompt(self, key: str | None) -> Positions | None:
        """The positions recorded for one prompt (any kind), or None when the trace never saw it: the key's own
        span, else every span recorded for its prompt merged (``replay_key``; a trace keyed by prompt alone too)."""
        if key is None:
            return None
        for counts in self.kinds.values():
            found = counts.prompts.get(key)
            if found is not None and found.num_steps > 0:
                return found
        base = key.partition("+")[0]
        if base not in self._spans:  # once per prompt: a simulation looks each request's up
            merged = Positions()
            for counts in self.kinds.values():
                for k, positions in counts.prompts.items():
                    if k.partition("+")[0] == base:
                        merged.merge(positions)
            self._spans[base] = merged if merged.num_steps > 0 else None
        return self._spans[base]

    def mean_accepted(self, kind: str = ALL, k: int = 4) -> float:
        """Expected accepted draft tokens of a chain of ``k`` (SmartSpec eq. 8 with measured p_i)."""
        p, total, run = ChainSampler(self, kind).probs(k), 0.0, 1.0
        for x in p:
            run *= x
            total += run
        return total

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.model_dump_json(indent=1) + "\n")
        return path


def load_trace(path: Path | str) -> AcceptanceTrace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such acceptance trace (record one: python -m bench.simulate trace)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON ({exc})") from None
    if isinstance(raw, dict) and raw.get("version", TRACE_VERSION) != TRACE_VERSION:
        raise TraceError(f"{path}: trace version {raw.get('version')}, this simulator reads {TRACE_VERSION}")
    try:
        return AcceptanceTrace.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "trace"
        raise TraceError(f"{path}: not a usable acceptance trace ({where}: {first['msg']})") from None


class ChainSampler:
    """p_i of one recorded prompt, or of one prompt kind scaled to a request's own rate (cached: the hot path)."""

    MAX_POSITIONS = 64

    def __init__(self, trace: AcceptanceTrace, kind: str, scale: float = 1.0, prompt: str | None = None) -> None:
        seen = trace.prompt(prompt)
        if seen is not None:  # the prompt's own positions: nothing to scale
            base, scale = seen.rates() or [0.0], 1.0
        else:
            base = trace.counts(kind).rates() or [0.0]
        self.scale = scale
        self._p = [min(1.0, max(0.0, base[min(i, len(base) - 1)] * scale)) for i in range(self.MAX_POSITIONS)]
        self._trees: dict[tuple[int, int], list[float]] = {}

    def probs(self, k: int) -> list[float]:
        return self._p[:k] if k <= self.MAX_POSITIONS else self._p + [self._p[-1]] * (k - self.MAX_POSITIONS)

    def p(self, position: int) -> float:
        return self._p[min(position, self.MAX_POSITIONS - 1)]

    def hit_within(self, position: int, width: int) -> float:
        """P(the target's token is among the draft's top ``width`` at ``position``)."""
        if width <= 0:
            return 0.0
        return 1.0 - (1.0 - self.p(position)) * SIBLING_MISS ** (width - 1)

    def tree_probs(self, depth: int, width: int) -> list[float]:
        """Draft probabilities of a depth x width tree (level by level, rank 1..w): P(the target picks rank r)."""
        key = (depth, width)
        if key not in self._trees:
            self._trees[key] = [self.hit_within(d, r) - self.hit_within(d, r - 1)
                                for d in range(depth) for r in range(1, width + 1)]  # fmt: skip
        return self._trees[key]


def prompt_key(prompt_ids) -> str:
    """What identifies a prompt across runs and processes (its token ids), short."""
    return hashlib.sha1(",".join(map(str, prompt_ids)).encode()).hexdigest()[:16]


def replay_key(prompt_ids, max_new_tokens: int | None = None) -> str:
    """A prompt and the output budget it was asked with: greedy decoding makes the pair one output span."""
    key = prompt_key(prompt_ids)
    return key if max_new_tokens is None else f"{key}+{max_new_tokens}"


def chain_rate(p: list[float], k: int, scale: float = 1.0) -> float:
    """Accepted / drafted tokens of a chain of ``k`` with p_i scaled: (1/k) sum_j prod_{i<=j} min(1, scale p_i)."""
    total, run = 0.0, 1.0
    for i in range(k):
        run *= min(1.0, scale * p[min(i, len(p) - 1)])
        total += run
    return total / k


def scale_for_rate(p: list[float], k: int, rate: float) -> float:
    """The scale of p_i at which a chain of ``k`` accepts ``rate`` of its tokens (bisection: monotone in scale)."""
    positive = [x for x in p if x > 0]
    if not positive:
        return 1.0
    lo, hi = 0.0, 1.0 / min(positive)  # at hi every p_i is 1: the rate is 1
    if rate >= 1.0:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chain_rate(p, k, mid) < rate else (lo, mid)
    return (lo + hi) / 2


def request_scale(trace: AcceptanceTrace, kind: str, rng: random.Random) -> float:
    """A request's p_i scale: a rate drawn from its kind's recorded requests, and the scale at which the kind's
    p_i give a chain of the recorded typical k that rate (the chain's rate is not linear in the scale)."""
    counts = trace.counts(kind)
    rates = counts.request_rates
    if len(rates) < 2:
        return 1.0
    return scale_for_rate(counts.rates() or [0.0], counts.typical_k, rng.choice(rates))
