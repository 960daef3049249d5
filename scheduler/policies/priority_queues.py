"""LAPS-SD's K priority queues on attained service (LAPS-SD §4.2, Figure 4).

    Q1 (highest)  0     <= E < S_1          S_j = M^(j-1) * S_1
    Q2            S_1   <= E < S_2 = M*S_1  (the S_j^up of the paper; S_j^down = S_(j-1))
    ...
    QK (lowest)   S_(K-1) <= E              unbounded

E is a request's attained service: the seconds of the iterations it ran in, less their prefills
(speculation + verification, ``Request.attained_service_s``, kept by the loop).
A new request has E = 0 and enters Q1; the loop adds each round's time to E,
so after every round the request is *demoted* to the queue its E falls in.
E never decreases, so a request only ever moves down.

S_1 is in seconds, so it depends on the hardware: the paper gives no value.
Unless configured, the scheduler sets it to ``Q1_ROUNDS`` profiled rounds of
a full batch (``q1_threshold``; services/scheduler/policies.py), so that a
request of a few dozen tokens finishes in Q1 on any machine; 0.5 s without a
profile. Too small an S_1 turns LAPS-SD into round robin (every request
preempted after a few rounds), which on bench-order's CPU runs made it 19-30 %
slower than FCFS; 30-100 rounds made it faster (README, issue 7). Exponentially wider
queues hold the long requests, whose KV is large, and so preempt them less often.
"""

from __future__ import annotations

from dataclasses import dataclass

Q1_ROUNDS = 48  # S_1 in rounds of a full batch, when profiled round costs give S_1 in seconds


@dataclass(frozen=True)
class QueueLevels:
    num_queues: int = 4  # K (the paper's best K is 4-6, fewer under more load, §5.2)
    first_threshold_s: float = 0.5  # S_1: attained service that leaves Q1
    growth: float = 2.0  # M

    def __post_init__(self) -> None:
        if self.num_queues < 1 or self.first_threshold_s <= 0 or self.growth <= 1:
            raise ValueError(f"priority queues need K >= 1, S_1 > 0 and M > 1, got {self}")

    def threshold(self, j: int) -> float:
        """S_j = M^(j-1) * S_1, the attained service at which a request leaves Q_j (1-based j)."""
        return self.growth ** (j - 1) * self.first_threshold_s

    def level(self, attained_s: float) -> int:
        """The queue (1 = highest priority ... K) a request with attained service ``attained_s`` belongs to."""
        for j in range(1, self.num_queues):
            if attained_s < self.threshold(j):
                return j
        return self.num_queues


def q1_threshold(round_s: float | None, rounds: int = Q1_ROUNDS, default_s: float = 0.5) -> float:
    """S_1 = ``rounds`` speculative rounds of ``round_s`` seconds (``default_s`` when the round cost is unknown)."""
    return rounds * round_s if round_s and round_s > 0 else default_s
