"""Serving metrics from per-request traces (client-side timestamps).

Definitions (AdaServe §6.1, SmartSpec §6):
- TTFT = t_first_token − t_sent
- TPOT = (t_last − t_first) / (n − 1) over the n output tokens (undefined for n < 2)
- a request attains its SLO when it finished normally and TPOT ≤ its TPOT SLO
  (and TTFT ≤ its TTFT SLO when one is set); a 1-token request has no TPOT and
  is judged on TTFT alone
- throughput = all output tokens / wall time; goodput = output tokens of
  SLO-attaining requests / wall time
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class RequestTrace:
    request_id: str
    slo_class: str
    tpot_slo_ms: float | None
    sent_s: float
    token_times_s: list[float]  # one per output token (tokens of one chunk share its time)
    finish_reason: str = "length"
    ttft_slo_ms: float | None = None
    num_steps: int = 0  # speculation steps
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def tpot_s(self) -> float | None:
        n = self.num_tokens
        return (self.token_times_s[-1] - self.token_times_s[0]) / (n - 1) if n >= 2 else None

    @property
    def latency_s(self) -> float | None:
        return self.token_times_s[-1] - self.sent_s if self.token_times_s else None

    @property
    def ok(self) -> bool:
        return self.finish_reason in ("length", "stop", "eos") and self.num_tokens > 0

    @property
    def attained(self) -> bool:
        if not self.ok:
            return False
        tpot, ttft = self.tpot_s, self.ttft_s
        if self.tpot_slo_ms is not None and tpot is not None and tpot * 1e3 > self.tpot_slo_ms:
            return False
        return not (self.ttft_slo_ms is not None and ttft * 1e3 > self.ttft_slo_ms)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
    }


@dataclass
class Summary:
    num_requests: int
    num_ok: int
    wall_s: float
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    latency_s: dict[str, float | None]
    throughput_tok_s: float
    goodput_tok_s: float
    attainment: float
    attainment_by_class: dict[str, float] = field(default_factory=dict)
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None  # accepted draft tokens per step, plus the bonus token

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(traces: list[RequestTrace], wall_s: float) -> Summary:
    if wall_s <= 0:
        raise ValueError("wall time must be positive")
    ok = [t for t in traces if t.ok]
    by_class: dict[str, list[RequestTrace]] = defaultdict(list)
    for t in traces:
        by_class[t.slo_class].append(t)
    steps = sum(t.num_steps for t in traces)
    drafted = sum(t.num_draft_tokens for t in traces)
    accepted = sum(t.num_accepted_tokens for t in traces)
    return Summary(
        num_requests=len(traces),
        num_ok=len(ok),
        wall_s=wall_s,
        ttft_s=_stats([t.ttft_s for t in ok]),
        tpot_s=_stats([t.tpot_s for t in ok if t.tpot_s is not None]),
        latency_s=_stats([t.latency_s for t in ok]),
        throughput_tok_s=sum(t.num_tokens for t in traces) / wall_s,
        goodput_tok_s=sum(t.num_tokens for t in traces if t.attained) / wall_s,
        attainment=sum(t.attained for t in traces) / len(traces) if traces else 0.0,
        attainment_by_class={c: sum(t.attained for t in ts) / len(ts) for c, ts in sorted(by_class.items())},
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_length=(accepted + steps) / steps if steps else None,
    )
