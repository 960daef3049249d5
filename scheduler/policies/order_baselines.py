"""The request-order baselines LAPS-SD is compared with (LAPS-SD §5.1).

LAS, least attained service (Rai et al. 2003): the request that has received
the least service runs first, preemptively. Attained service is quantized in
steps of ``quantum_s`` (FCFS within a step) so that two requests do not swap
places after every iteration; any running request may be preempted.

LP-SJF, length-prediction shortest job first (Qiu et al. 2024): waiting
requests ordered by predicted remaining output length (length_predictor.py),
non-preemptive; knows nothing of acceptance rates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.policies.length_predictor import ClassHistoryPredictor, LengthPredictor
from scheduler.policies.preemptive import ranked_admission
from scheduler.policies.shared_state import SharedState
from scheduler.policies.queue import Admission, Capacity, QueuePolicy
from scheduler.request import Request


def _arrival(req: Request) -> float:
    return req.arrival_time if req.arrival_time is not None else float("inf")


class LAS(QueuePolicy):
    name = "las"

    def __init__(self, quantum_s: float = 0.5) -> None:
        if quantum_s <= 0:
            raise ValueError("LAS quantum must be > 0")
        self.quantum_s = quantum_s

    def rank(self, req: Request) -> tuple:
        return (req.priority, math.floor(req.attained_service_s / self.quantum_s), _arrival(req))

    def order(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=self.rank)

    def schedule(
        self, waiting: Sequence[Request], running: Sequence[Request], capacity: Capacity, now: float
    ) -> Admission:
        return ranked_admission(waiting, running, capacity, key=self.rank)


class LPSJF(QueuePolicy):
    name = "lp-sjf"

    def __init__(self, predictor: LengthPredictor | None = None) -> None:
        self.predictor = predictor or ClassHistoryPredictor()

    def rank(self, req: Request) -> tuple:
        return (req.priority, self.predictor.predict(req) - req.num_generated, _arrival(req))

    def order(self, waiting: Sequence[Request], now: float) -> list[Request]:
        return sorted(waiting, key=self.rank)  # the base schedule admits in this order, never preempts

    def on_finish(self, req: Request) -> None:
        self.predictor.observe(req)

    def shared_state(self) -> SharedState | None:
        return getattr(self.predictor, "shared_state", lambda: None)()
