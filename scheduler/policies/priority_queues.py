"""LAPS-SD's K priority queues on attained service (LAPS-SD §4.2, Figure 4).

    Q1 (highest)  0     <= E < S_1          S_j = M^(j-1) * S_1
    Q2            S_1   <= E < S_2 = M*S_1  (the S_j^up of the paper; S_j^down = S_(j-1))
    ...
    QK (lowest)   S_(K-1) <= E              unbounded

E is a request's attained service: the seconds of the iterations it ran in
(speculation + verification, ``Request.attained_service_s``, kept by the loop).
A new request has E = 0 and enters Q1; the loop adds each round's time to E,
so after every round the request is *demoted* to the queue its E falls in.
E never decreases, so a request only ever moves down. Exponentially wider
queues hold the long requests, whose KV is large, and so preempt them less often.
"""

from __future__ import annotations

from dataclasses import dataclass


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
