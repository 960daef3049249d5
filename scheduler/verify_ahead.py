"""Relayed verify run-ahead: under a fixed speculation policy, step N+1's verify leaves as soon as step N's is in.

    step N:    verify N (relayed, draft_relay.py) ─▶ outcome N ─┬─▶ verify N+1 sent now: the same requests, each
                                                                │   taking the tree the draft drafts from step N's
               commit N, stream tokens, observers, releases ◀───┘   tokens, with the same shape handed off again
    step N+1:  outcome N+1 is this step's verify: commit it, send N+2 ...

With the draft relay a speculative step needs nothing from the scheduler that it does not know once the
outcome is in, when the shapes cannot change: the requests (all running ones, nobody waiting to be
admitted), their shapes (a policy with ``static_shapes``: the same shape every step, capped near the end
by the target as ``plan_shapes`` caps it) and their trees (relayed). So the scheduler's own per-step work
runs beside the target's and the draft's, as vLLM's async scheduling and SGLang's overlap scheduler do.

What the loop sees is unchanged: step N+1's outcome is the verify the loop would have sent, over the same
trees. A request that ends at commit N (a stop, an abort, a preemption) was verified once more for nothing:
its result is dropped and its release settles it on both workers, as decode run-ahead does
(services/scheduler/run_ahead.py). Anything that could change the plan stops the run-ahead for a step:
a request waiting, one not relayed (a missed tree, the end of its budget), a chunked prefill, a draft or
target in recovery, elastic draft memory.

With ``repeat`` R (step streams: TargetPlan.repeat, services/target/repeat_plan.py) the verify sent ahead
also asks the target for R continuation steps of the same requests, run by the target itself: one plan per
R+1 steps, and no round trip between them. Each continuation is read as the next step's verify, whatever
the loop would have planned (so admission waits up to R steps more, and a request that ends meanwhile is
verified up to R times more for nothing); R is cut so that no request's budget runs out before the last.
As the last continuation owed is read, the same requests going on as known, the read first asks the target
for R+1 more (TargetPlan.goes_on): the plan is at the target before that step ends, so the target never
waits for the scheduler between groups of steps. A request that ended stops it (its release rides on the
loop's next plan), as does anything that stops a verify sent ahead.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from scheduler.request import Request, RequestState
from scheduler.spec_shape import SpecShape
from shared.engine.types import RELAY_TAKE, AcceptResult, TokenTree, VerifyItem


class VerifyAhead:
    def __init__(self, repeat: int = 0) -> None:
        self.repeat = repeat  # continuation steps each verify sent ahead asks for (step streams only)
        self.pace = None  # or a StepPace: the repeat then follows the step time, up to its most (step_pace.py)
        self._task: asyncio.Task | None = None
        self._batch: list[Request] = []
        self._shapes: list[SpecShape] = []
        self._owed = 0  # continuation steps of the last plan still to read
        self._collected_at = -1  # the loop step that collected the last verify sent ahead
        self._items: list[VerifyItem] = []  # that plan's items, as its continuations read them (continued)
        self.num_sent = 0  # verifies sent ahead, all time
        self.num_continued = 0  # continuation steps read, all time
        self.num_went_on = 0  # plans that went on from the last continuation owed (TargetPlan.goes_on), all time

    @property
    def most(self) -> int:
        """Continuation steps the next plan may ask for: ``repeat``, or the pace's where the step time sets it."""
        return self.pace.repeat if self.pace is not None else self.repeat

    @property
    def pending(self) -> bool:
        return self._task is not None

    def start(self, loop, batch: list[Request], results: list[AcceptResult]) -> bool:
        """After step N's verify, before its commit: send step N+1's verify when its plan is already known (or read
        the next continuation step of the last one sent, which comes whatever the loop would plan)."""
        if self.pace is not None:
            self.pace.tick(loop.clock.now())
        if self._owed and self._collected_at != loop._num_steps:
            self._owed = 0  # not read in the step that collected its plan (nothing left to verify): the stream
            # drains it before its next plan (services/scheduler/plan_stream.py)
        if self._owed:
            self._owed -= 1
            more = self._more(loop, batch, results) if not self._owed else 0  # the last one owed: go on after it?
            self._owed += more
            self.num_went_on += bool(more)
            items = self._items if not more else [replace(self._items[0], repeat=more), *self._items[1:]]  # the
            # worker reads the call's ``repeat`` off its first item
            self._task = asyncio.get_running_loop().create_task(loop.target.verify(items), name="verify-continued")
            self.num_continued += 1
            return True
        known = self._known(loop, batch, results)
        if known is None:
            return False
        outs, remaining = known
        repeat = _repeat(self.most, remaining, [out.shape for out in outs])
        items = [VerifyItem(req.id, relay=RELAY_TAKE, handoff=out.shape.spec_item(req.id, []), remaining=left,
                            repeat=repeat) for req, out, left in zip(batch, outs, remaining)]  # fmt: skip
        self._batch, self._shapes = list(batch), [out.shape for out in outs]
        self._owed, self._items = repeat, [replace(item, continued=True, repeat=0) for item in items] if repeat else []
        self._task = asyncio.get_running_loop().create_task(loop.target.verify(items), name="verify-ahead")
        self.num_sent += 1
        return True

    def _known(self, loop, batch: list[Request], results: list[AcceptResult]) -> tuple[list, list[int]] | None:
        """The relay outs of ``batch`` and what each request may still emit after ``results``, when the next verify's
        plan is known already: every request running relayed, nobody waiting, both workers well; else None."""
        if (not batch or loop._waiting or len(batch) != len(loop._running) or not loop.target_link.up
                or not loop.link.usable or loop.link.stale or loop.elastic is not None):  # fmt: skip
            return None
        outs = [loop.relay.out(req.id) for req in batch]
        if not all(res.relayed and out is not None for res, out in zip(results, outs)):
            return None
        return outs, [req.num_remaining - len(res.tokens) for req, res in zip(batch, results)]

    def _more(self, loop, batch: list[Request], results: list[AcceptResult]) -> int:
        """Steps to go on with after the last continuation owed (0: none), asked for as it is read so that the target
        runs them without waiting for a plan (TargetPlan.goes_on): while the plan's requests all still run as known."""
        if not self.most or len(batch) != len(self._items) or getattr(loop.target, "renewing", False) or \
                (known := self._known(loop, batch, results)) is None:  # fmt: skip
            return 0  # one that ended is released by the next plan of the loop's own; a stream that is to move to
            # new credentials moves at the next plan
        outs, remaining = known
        return _repeat(self.most + 1, remaining, [out.shape for out in outs])  # the one owed and these: R + 1 steps

    async def collect(self, loop, report) -> tuple[list[Request], list[SpecShape], list[TokenTree], list[AcceptResult]] | None:
        """Step N+1's verify, for the requests still running (the others' results are dropped); None when it failed
        (a verify failure, handled as the loop handles one)."""
        task, batch, shapes, self._task = self._task, self._batch, self._shapes, None
        self._collected_at = loop._num_steps
        try:
            results = await task
            if len(results) != len(batch):
                raise RuntimeError(f"target verify returned {len(results)} results for {len(batch)} items")
        except Exception as exc:  # noqa: BLE001 - as _verify: reported to the requests
            self._owed = 0  # a continuation of a failed plan is not read (the stream drops or drains it)
            loop.relay.failed(batch, loop.link)
            loop._fail(batch, "target verify failed", exc, report)
            return None
        keep = []
        for i, req in enumerate(batch):
            out = loop.relay.pop(req.id)
            if req.state is RequestState.RUNNING and req.id in loop._running:
                # the target committed its tokens whether or not a relayed tree was verified (a continuation of
                # a request whose tree was missed ran a plain decode): they are the request's next tokens
                if out is not None:
                    loop.relay.consume(req, out)
                keep.append(i)
        trees = [results[i].relay_tree or TokenTree() for i in keep]
        return [batch[i] for i in keep], [shapes[i] for i in keep], trees, [results[i] for i in keep]

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task, self._owed = None, 0


def _repeat(most: int, remaining: list[int], shapes: list[SpecShape]) -> int:
    """Continuation steps, up to ``most``, that every request can take whole: each step may emit a shape's depth + 1
    tokens, and the first of R+1 steps leaves ``remaining`` after the step before."""
    for r in range(most, 0, -1):
        if all(left >= (r + 2) * (shape.max_depth + 1) for left, shape in zip(remaining, shapes)):
            return r
    return 0
