"""Outcome hold: while steps are short, a continuation step's outcome waits for the next one's; both leave together.

    plan s (repeat 3):  step s ─ held ─┐
                        step s+1 ──────┴─▶ TargetOutcome(s, then=[s+1])   one message for two steps
                        step s+2 ────────▶ TargetOutcome(s+2)              the last two leave one by one, so
                        step s+3 ────────▶ TargetOutcome(s+3)              the scheduler's goes_on lands in time

On a 2-core host each message costs about 0.1-0.2 ms of CPU across both ends (gRPC's poller threads, the
event loops' wake-ups), as much as a whole step of a small batch: one fewer message per pair of steps is
CPU the other processes run on. The price is latency: a held outcome's tokens reach their clients one
step later. So an outcome is held only

- when the step that produced it took under ``hold_s`` (a GPU forward of a real model takes longer, and
  then nothing is held: each outcome leaves at once, as before);
- when three more steps are owed after it: the next one, whose outcome carries it, and the last two of the
  group, which leave alone. The scheduler asks for more steps (TargetPlan.goes_on) as soon as it has read the
  last-but-one outcome owed, so that outcome must come on its own, not behind one more to commit first;
  then the plan is at the target before the group's last step ends. So at R = 3 the first two steps of a
  group pair, and at R = 2 or 1 nothing is held;
- when it carries no error, and at most ``most`` outcomes travel together.

Like vLLM's ``stream_interval``, which buffers a request's tokens over steps to save host work, the tokens and
their order are unchanged: the scheduler reads the outcomes of a message one by one, as if each had come alone.
"""

from __future__ import annotations

from shared.rpc.gen.tandem.v1 import target_pb2

HOLD_S = 0.002  # the longest step whose outcome may wait for the next one's
MOST = 2  # outcomes per message


class OutcomeHold:
    def __init__(self, hold_s: float = HOLD_S, most: int = MOST) -> None:
        self.hold_s = hold_s
        self.most = most
        self._held: list[target_pb2.TargetOutcome] = []  # in step order
        self.num_held = 0  # outcomes that waited for the next one, all time

    def offer(self, outcome: target_pb2.TargetOutcome, steps_after: int,
              step_s: float) -> target_pb2.TargetOutcome | None:  # fmt: skip
        """The message to write after a step (``steps_after``: steps still owed after it; ``step_s``: how long it
        took), or None while its outcome is held."""
        if (steps_after >= 3 and step_s < self.hold_s and len(self._held) + 1 < self.most
                and not outcome.HasField("error")):  # fmt: skip
            self._held.append(outcome)
            self.num_held += 1
            return None
        if not self._held:
            return outcome
        first, *rest = self._held
        self._held = []
        first.then.extend([*rest, outcome])
        return first
