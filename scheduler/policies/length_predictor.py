"""Output-length prediction, the L_i of LAPS-SD eq. 6 and the key of LP-SJF.

The paper predicts L_i with a fine-tuned LLM (Zheng et al. 2024); that is out
of scope here, so prediction is an interface with one simple implementation:

``ClassHistoryPredictor``: a request's *class* is the power-of-two bucket of
its prompt length (chat one-liners, code tasks and documents to summarise
land in different buckets). Per class it keeps exponential moving averages,
over finished requests, of

    share        generated / max_new_tokens   (a stop token ends many early)
    acceptance   the request's acceptance rate (when it speculated): the prior
                 A of LAPS-SD's ``prior`` ranking for requests not yet perceptible

Prediction::

    L = max_new_tokens                          fewer than min_samples in the class
    L = clamp(share_ema · max_new_tokens,       otherwise
              generated so far + 1, max_new_tokens)

so it never predicts less than what a running request already produced, nor
more than it may produce.

The history is a ``SharedState`` (shared_state.py, blob ``policy:length-predictor``):
each finished request is one event {class, share, acceptance}, so the
scheduler keeps it in Redis across restarts and replicas share it
(services.scheduler.observers.policy_state); the predictor itself does no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from scheduler.policies.shared_state import Event, SharedState, State
from scheduler.request import FinishReason, Request


class LengthPredictor(Protocol):
    def predict(self, req: Request) -> float:
        """Predicted total output tokens of ``req`` (generated so far included)."""
        ...

    def observe(self, req: Request) -> None:
        """Learn from a request that ended (only those that finished normally are informative)."""
        ...


class MaxTokensPredictor:
    """L = max_new_tokens: the bound every request states, no history."""

    def predict(self, req: Request) -> float:
        return float(req.max_new_tokens)

    def observe(self, req: Request) -> None:
        pass

    def prior_acceptance(self, req: Request) -> float | None:
        return None

    def shared_state(self) -> SharedState | None:
        return None


STATE_VERSION = 2  # 2: per-class acceptance as well as the length share


class ClassHistoryPredictor:
    def __init__(self, smoothing: float = 0.2, min_samples: int = 2) -> None:
        if not 0 < smoothing <= 1 or min_samples < 1:
            raise ValueError("smoothing must be in (0, 1] and min_samples >= 1")
        self.smoothing = smoothing
        self.min_samples = min_samples
        self.learned = SharedState("policy:length-predictor", STATE_VERSION, _empty, self._apply)

    @property
    def history(self) -> dict[str, dict[str, float]]:
        """class -> {"share": ema, "n": samples, "acceptance": ema, "n_acc": samples}."""
        return self.learned.state["classes"]

    @staticmethod
    def prompt_class(req: Request) -> str:
        return f"p{max(0, math.ceil(math.log2(max(1, len(req.prompt_ids)))))}"

    def predict(self, req: Request) -> float:
        h = self.history.get(self.prompt_class(req))
        if h is None or h["n"] < self.min_samples:
            return float(req.max_new_tokens)
        guess = h["share"] * req.max_new_tokens
        return float(min(req.max_new_tokens, max(guess, req.num_generated + 1)))

    def prior_acceptance(self, req: Request) -> float | None:
        """The class's mean acceptance rate, None until ``min_samples`` speculating requests finished."""
        h = self.history.get(self.prompt_class(req))
        if h is None or h.get("n_acc", 0) < self.min_samples:
            return None
        return h["acceptance"]

    def observe(self, req: Request) -> None:
        if req.finish_reason in (None, FinishReason.ABORTED, FinishReason.ERROR) or req.max_new_tokens < 1:
            return
        share = min(1.0, req.num_generated / req.max_new_tokens)
        self.learned.record({"class": self.prompt_class(req), "share": share, "acceptance": req.acceptance_rate})

    def _apply(self, state: State, event: Event) -> State:
        """One finished request folded into its class's moving averages."""
        h = state["classes"].setdefault(event["class"], {"share": event["share"], "n": 0, "acceptance": 0.0, "n_acc": 0})
        h["share"] += self.smoothing * (event["share"] - h["share"]) if h["n"] > 0 else 0.0
        h["n"] += 1
        acc = event.get("acceptance")
        if acc is not None:
            h["acceptance"] = acc if h["n_acc"] == 0 else h["acceptance"] + self.smoothing * (acc - h["acceptance"])
            h["n_acc"] += 1
        return state

    def shared_state(self) -> SharedState:
        return self.learned

    def state(self) -> dict[str, Any]:
        return self.learned.state

    def load(self, state: dict[str, Any] | None) -> None:
        self.learned.adopt(state)


def _empty() -> State:
    return {"classes": {}}
