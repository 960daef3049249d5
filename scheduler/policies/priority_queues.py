"""LAPS-SD's K priority queues on attained service (LAPS-SD §4.2, Figure 4).

    Q1 (highest)  0     <= E < S_1          S_j = M^(j-1) * S_1
    Q2            S_1   <= E < S_2 = M*S_1  (the S_j^up of the paper; S_j^down = S_(j-1))
    ...
    QK (lowest)   S_(K-1) <= E              unbounded

E is a request's attained service. The paper measures it in seconds: the
iterations a request ran in, less their prefills (speculation + verification,
``Request.attained_service_s``, kept by the loop). Here it is counted in
*rounds* by default (``unit="rounds"``: ``Request.attained_rounds``, the
speculative rounds a request ran in), and S_1 = ``Q1_ROUNDS`` rounds.
A new request has E = 0 and enters Q1; the loop adds each round to E,
so after every round the request is *demoted* to the queue its E falls in.
E never decreases, so a request only ever moves down.

Why rounds: S_1 in seconds depends on the hardware (the paper gives no value).
An earlier version derived it from the profiled cost of a full batch's round
and fell back to 0.5 s without a profile; on a machine with no profile (or a
stale one from another machine) that is a handful of rounds, and LAPS-SD turns
into round robin: every request preempted after a few rounds (bench-order
without a profile on the 2-core Intel machine: 1.13x FCFS's mean latency with
``est=1``, TPOT 267 ms against 55; 19-30 % slower than FCFS in the issue-7
pilots with S_1 = 2 s). A round is the one unit that follows the machine by
construction: 48 rounds let a request of a few dozen tokens finish in Q1
anywhere. ``s1=<seconds>`` (``unit="s"``) keeps the paper's time-based E.
Exponentially wider queues hold the long requests, whose KV is large, and so
preempt them less often.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Q1_ROUNDS = 48  # S_1 in rounds, unless configured in seconds


@dataclass(frozen=True)
class QueueLevels:
    num_queues: int = 4  # K (the paper's best K is 4-6, fewer under more load, §5.2)
    first_threshold: float = Q1_ROUNDS  # S_1: attained service that leaves Q1, in ``unit``
    growth: float = 2.0  # M
    unit: Literal["rounds", "s"] = "rounds"  # what E and S_j count: rounds run, or seconds (the paper)

    def __post_init__(self) -> None:
        if self.num_queues < 1 or self.first_threshold <= 0 or self.growth <= 1 or self.unit not in ("rounds", "s"):
            raise ValueError(f"priority queues need K >= 1, S_1 > 0, M > 1 and unit rounds or s, got {self}")

    def threshold(self, j: int) -> float:
        """S_j = M^(j-1) * S_1, the attained service at which a request leaves Q_j (1-based j)."""
        return self.growth ** (j - 1) * self.first_threshold

    def attained(self, req) -> float:
        """E_i in this queue's unit: rounds the request ran in, or their seconds less prefills."""
        return req.attained_rounds if self.unit == "rounds" else req.attained_service_s

    def level(self, attained: float) -> int:
        """The queue (1 = highest priority ... K) a request with attained service ``attained`` belongs to."""
        for j in range(1, self.num_queues):
            if attained < self.threshold(j):
                return j
        return self.num_queues

    def describe(self) -> str:
        return f"S_1 = {self.first_threshold:g} {'rounds' if self.unit == 'rounds' else 's'}"
