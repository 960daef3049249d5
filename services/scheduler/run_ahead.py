"""Decode run-ahead: a target-only scheduler's next plain-decode step leaves before the loop asks for it.

    loop step N:   verify(ids) ─▶ outcome N (sent ahead during step N-1: usually there already)
                                  ─▶ send plan N+1 = the same ids, no trees ─┐ the target computes N+1
                   commit N, stream tokens, observers, plan N+1 ◀────────────┘ while the loop works
    loop step N+1: verify(ids) ─▶ outcome N+1 ...

Without a draft every step is a plain decode whose plan the loop already knows: the sequences still
running, each decoding from the bonus token the target itself sampled (it keeps it; target_engine.py).
So once a step's outcome is in, the worker sends the next plan at once, and the target's forward runs
beside the scheduler's commit and planning, as vLLM's async scheduling and SGLang's overlap scheduler do.

What the loop sees is unchanged. A result sent ahead is kept per sequence until the loop asks for that
sequence's next decode, and that answer is what the step would have computed then: the same position
of the same sequence, in the target's own state. So:
- a sequence that finished (stop token, stop string, length) or was aborted or preempted for
  recompute is released: its result is dropped, and the release rides on the next plan;
- a sequence preempted with its KV kept keeps its result until it is resumed;
- a sequence prefilled again (after a target restart) drops it;
- a step that adds prefills (admission, chunked prefill) sends them at once and takes the decoded
  sequences' results from the buffer;
- an ahead plan the target refused (a StepError: the engine commits nothing of a refused step) is
  forgotten, and its sequences are computed when the loop asks; a broken stream fails the loop's
  call, as any target failure does (the loop re-prefills everything once the target answers).
A tree to verify (a draft's) for a sequence holding a result would be out of step with the target, so
the scheduler turns run-ahead on only when it has no draft (services/scheduler/main.py).

With ``repeat`` R (TargetPlan.repeat, services/target/repeat_plan.py) a plan sent ahead also asks the
target to decode the same sequences R more times by itself: one plan per R+1 steps, and no round trip
between them. Results then queue per sequence, oldest first, and the next plan leaves once the owed
outcomes are read and taken. A continuation decodes a sequence that ended meanwhile once more, for nothing,
as a plan sent ahead does; the loop's releases since the plan left drop those results. As the last outcome
owed is read, with nothing released since the plan left, the worker first asks for R+1 more decodes of the
same sequences (TargetPlan.goes_on): the target goes on without waiting for a plan. A release stops that
(it rides on the next plan of its own), and a step that prefills reads everything owed first (admission
waits for them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.engine.types import AcceptResult, VerifyItem


@dataclass
class RunAhead:
    results: dict[str, list[AcceptResult]] = field(default_factory=dict)  # seq id -> its next decodes, computed ahead
    sent: tuple[int, list[str], list[str]] | None = None  # (step, seq ids, releases) of the next outcome owed
    owed: int = 0  # continuation outcomes owed after that one
    repeat: int = 0  # continuation steps each plan sent ahead asks for
    pace: object = None  # or a StepPace (scheduler/step_pace.py): the repeat then follows the step time, up to its most
    released: set[str] = field(default_factory=set)  # ids released since the last plan left (their results drop)
    num_plans: int = 0  # plans sent ahead, all time
    num_went_on: int = 0  # plans that went on from the last outcome owed (TargetPlan.goes_on), all time
    num_used: int = 0  # results sent ahead that the loop took
    num_dropped: int = 0  # results sent ahead and dropped (released, prefilled again)

    def most(self) -> int:
        """Continuation steps the next plan asks for: ``repeat``, or the pace's (ticked once per loop step)."""
        return self.pace.repeat if self.pace is not None else self.repeat

    def split(self, verifies: list[VerifyItem]) -> tuple[dict[int, AcceptResult], list[VerifyItem]]:
        """The loop's verifies: (index -> result computed ahead, those to compute now)."""
        hits: dict[int, AcceptResult] = {}
        misses: list[VerifyItem] = []
        for i, item in enumerate(verifies):
            queued = self.results.get(item.seq_id)
            res = queued.pop(0) if queued else None
            if queued is not None and not queued:
                del self.results[item.seq_id]
            if res is not None and len(item.tree):
                raise RuntimeError(f"run-ahead: a tree to verify for {item.seq_id}, which the target decoded ahead")
            if res is not None:
                hits[i] = res
            else:
                misses.append(item)
        self.num_used += len(hits)
        return hits, misses

    def keep(self, seq_ids: list[str], results: list[AcceptResult], released: set[str]) -> None:
        """An ahead plan's outcome: held per sequence, but not for those released since it left."""
        for seq_id, res in zip(seq_ids, results):
            if seq_id in released or seq_id in self.released:
                self.num_dropped += 1
            else:
                self.results.setdefault(seq_id, []).append(res)

    def drop(self, seq_ids) -> None:
        for seq_id in seq_ids:
            self.num_dropped += len(self.results.pop(seq_id, ()))

    def buffered(self, seq_ids) -> bool:
        """Some of these sequences still hold a result computed ahead."""
        return any(seq_id in self.results for seq_id in seq_ids)

    @staticmethod
    def merge(verifies: list[VerifyItem], hits: dict[int, AcceptResult], computed: list[AcceptResult]) -> list[AcceptResult]:
        """The results in the loop's order: those computed ahead at their index, the rest in order."""
        rest = iter(computed)
        return [hits[i] if i in hits else next(rest) for i in range(len(verifies))]
