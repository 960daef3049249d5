"""Whether frontier pipelining pays at this batch size, measured: both modes' time per emitted token.

FASER's §4.3 inequality decides from cost models (frontier.py), and it models
neither side slowing the other down: on this 2-core CPU a forward on one core
runs 1.28x slower while the other core drafts (24 rows, bf16, measured
2026-11-29), and a feature draft has no standalone profile at all, so a fixed
chunk pipelined every step: at batch 1 that paid (TPOT −10 %), at 4x and 8x
load it cost +14 % and +42 % (bench/results/faser-eagle, 2026-11-29).

So where the models (or a fixed chunk) say "pipeline", this gate checks them
against what both modes measurably achieve, per batch-size bucket
(1, 2-3, 4-7, 8-15, 16+): the emitted tokens over the step time (prefill
excluded), decayed sums per mode. Until both modes have ``min_steps`` steps in
a bucket the gate alternates runs of ``run_steps`` steps; after that it
pipelines unless serial steps measured ``margin`` faster per token (the models'
choice stands on a tie: a step's tokens follow its requests' acceptance more
than its mode), and every ``explore_every`` steps in the bucket runs the other
mode for ``run_steps`` steps, so a change of load or machine is seen. The first step
of each run pays the switch (a draft that held optimistic tokens is
re-prefilled on the way back to serial) and is not counted. With ``fresh`` the
mode not taken is judged on its last exploration run alone, and only as that run
ends: on a busy host a slow stretch of the mode in use (a neighbour's burst, the
tail of a batch), set against the other mode's steps of a thousand steps ago,
flipped the relay's lookahead on at batch 64, where it costs 30 %.

Pure: the loop reports each step it asked about (``observe``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

PIPE, SERIAL = "pipe", "serial"


class MeasuredGateConfig(BaseModel):
    enabled: bool = Field(True, description="Check the pipelining choice against both modes' measured token rates.")
    min_steps: int = Field(6, ge=1, description="Counted steps of each mode in a bucket before the faster one is taken.")
    run_steps: int = Field(4, ge=2, description="Steps in a row per exploration run (the first one is not counted).")
    explore_every: int = Field(50, ge=2, description="Steps in a bucket between runs of the slower mode.")
    decay: float = Field(0.99, gt=0.0, le=1.0, description="Weight kept by older steps at each new one.")
    window: int = Field(
        0, ge=0,
        description="With N > 0, a mode's time per token is the trimmed mean of its last N counted steps' (the "
        "slowest and fastest tenth left out) instead of the decayed sums: a few slow steps (a process warming up, a "
        "neighbour's burst) do not outvote the rest, none older than N steps of that mode counts, and a mode whose "
        "steps alternate fast and slow (the lookahead's at batch 64: 1.3 and 2.5 ms) is judged on their mean, which "
        "a median is not.",
    )  # fmt: skip
    lag: int = Field(
        1, ge=1,
        description="A step is counted for its mode when this many choices in a row (its own included) were that mode: "
        "where a choice pays off only a step later (the relay lookahead), the step after a switch is not the mode's.",
    )
    abba: bool = Field(
        False,
        description="While learning, runs go P S S P P S ... instead of P S P S ...: each mode is as often measured "
        "first as second, so a steady trend in step times (a process warming up) favours neither.",
    )
    hysteresis: float = Field(
        0.0, ge=0.0,
        description="Once a mode is taken, the other must measure this much further past the margin to replace it: "
        "where both modes are about as fast, noise does not flip the choice for a whole exploration period.",
    )
    fresh: bool = Field(
        False,
        description="Once a mode is taken, the other is judged on its last exploration run alone (its window emptied "
        "as each run starts), and the choice changes only as such a run ends: a slow stretch of the mode in use, "
        "set against the other's steps of long ago, does not flip it. Needs a window.",
    )
    margin: float = Field(
        0.05, ge=0.0,
        description="Serial must measure this much faster per token to overrule the models' choice to pipeline "
        "(a step's tokens follow its requests' acceptance more than its mode: short samples are noisy).",
    )  # fmt: skip


def bucket(batch_size: int) -> int:
    """0 for 1, 1 for 2-3, 2 for 4-7, 3 for 8-15, 4 for 16 and up."""
    return min(4, max(0, batch_size).bit_length() - 1)


@dataclass
class _Rate:
    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0
    recent: deque | None = None  # with a window: the last steps' seconds per token

    def add(self, tokens: int, seconds: float, decay: float, window: int = 0) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.steps += 1
        if window and tokens > 0:
            if self.recent is None:
                self.recent = deque(maxlen=window)
            self.recent.append(seconds / tokens)

    def per_token(self) -> float | None:
        if self.recent:
            return trimmed_mean(self.recent)
        return self.seconds / self.tokens if self.tokens > 0 else None


def trimmed_mean(values, trim: float = 0.1) -> float:
    """The mean of ``values`` without the ``trim`` share of the largest and of the smallest (rounded)."""
    ordered = sorted(values)
    cut = round(len(ordered) * trim)
    kept = ordered[cut : len(ordered) - cut]
    return sum(kept) / len(kept)


@dataclass
class _Bucket:
    rates: dict[str, _Rate] = field(default_factory=lambda: {PIPE: _Rate(), SERIAL: _Rate()})
    steps: int = 0  # steps asked about in this bucket
    run_mode: str | None = None  # the mode of the run in progress
    run_left: int = 0  # its steps still to go
    settled: str | None = None  # the mode taken once both were learnt (with hysteresis)
    review: bool = True  # fresh: an exploration run just ended (or nothing was taken yet): judge again


class MeasuredGate:
    def __init__(self, config: MeasuredGateConfig | None = None):
        self.config = config or MeasuredGateConfig()
        self.buckets: dict[int, _Bucket] = {}
        self._pending: tuple[int, str, bool] | None = None  # (bucket, mode, counted) of the step asked about
        self._last: list[str | None] = [None] * self.config.lag  # the modes of the last steps, asked about or not

    def choose(self, batch_size: int) -> str:
        """PIPE or SERIAL for a step the cost models would pipeline."""
        cfg = self.config
        if not cfg.enabled:
            return PIPE
        b = self.buckets.setdefault(bucket(batch_size), _Bucket())
        b.steps += 1
        if b.run_left > 0:
            mode = b.run_mode
            b.run_left -= 1
            b.review = b.review or (b.run_left == 0 and b.settled is not None)
        else:
            pipe, serial = b.rates[PIPE], b.rates[SERIAL]
            if min(pipe.steps, serial.steps) < cfg.min_steps:  # still learning: alternate runs, the scarcer first,
                if pipe.steps == serial.steps and b.run_mode is not None and cfg.abba:  # on a tie the last one again:
                    mode = b.run_mode  # P S S P P S ..., so a trend (a process warming up) favours neither
                else:
                    mode = PIPE if pipe.steps <= serial.steps else SERIAL
                self._start_run(b, mode)
            else:
                if b.review or not cfg.fresh:  # fresh: only as an exploration run ends, on what it measured
                    b.settled, b.review = self._settle(b, batch_size), False
                best = b.settled
                if b.steps % cfg.explore_every == 0:
                    mode = SERIAL if best == PIPE else PIPE
                    self._start_run(b, mode)
                    if cfg.fresh and b.rates[mode].recent is not None:
                        b.rates[mode].recent.clear()  # judged on this run's steps alone
                else:
                    mode = best
        counted = all(m == mode for m in self._last)
        self._last = [*self._last[1:], mode]
        self._pending = (bucket(batch_size), mode, counted)
        return mode

    def _start_run(self, b: _Bucket, mode: str) -> None:
        b.run_mode, b.run_left = mode, self.config.run_steps - 1

    def _settle(self, b: _Bucket, batch_size: int) -> str | None:
        """The preferred mode, kept until the other measures ``hysteresis`` further past the margin."""
        h = self.config.hysteresis
        if not h or b.settled is None:
            return self.preferred(batch_size)
        pipe, serial = b.rates[PIPE].per_token(), b.rates[SERIAL].per_token()
        if pipe is None or serial is None:
            return b.settled
        edge = 1.0 - self.config.margin  # serial wins below this ratio to pipe, without hysteresis
        if b.settled == PIPE:
            return SERIAL if serial < (edge - h) * pipe else PIPE
        return PIPE if serial > (edge + h) * pipe else SERIAL

    def preferred(self, batch_size: int) -> str | None:
        """The mode with the lower measured time per token in this bucket; None before both were measured."""
        b = self.buckets.get(bucket(batch_size))
        if b is None:
            return None
        pipe, serial = b.rates[PIPE].per_token(), b.rates[SERIAL].per_token()
        if pipe is None or serial is None:
            return None
        return SERIAL if serial < (1.0 - self.config.margin) * pipe else PIPE

    def ran_serial(self) -> None:
        """A step this gate was not asked about ran serially (no chain to pipeline, or the models said no)."""
        self._last = [*self._last[1:], SERIAL]
        self._pending = None

    def observe(self, tokens: int, seconds: float) -> None:
        """The step last asked about emitted ``tokens`` in ``seconds`` (its prefill excluded)."""
        if self._pending is None:
            return
        key, mode, counted = self._pending
        self._pending = None
        if counted and seconds > 0:
            self.buckets[key].rates[mode].add(tokens, seconds, self.config.decay, self.config.window)

    def describe(self) -> str:
        parts = []
        for key in sorted(self.buckets):
            b = self.buckets[key]
            rates = " ".join(
                f"{m} {r.per_token() * 1e3:.1f} ms/token ({r.steps})" if r.per_token() else f"{m} - ({r.steps})"
                for m, r in b.rates.items()
            )
            parts.append(f"b~{1 << key}: {rates}")
        return "; ".join(parts)
