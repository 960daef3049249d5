"""Admission within the caps, preemption, and eviction under KV pressure, for the iteration loop.

    queue policy ── Admission(admit, preempt) ──▶ admit(): preempt what it names, admit what fits
                                                  (batch size, token budget), evict resident
                                                  requests while the reservations exceed the budget

Preemption (the queue policy names running requests in ``Admission.preempt``):
the request goes back to waiting and leaves the batch. With
``keep_kv_on_preempt`` it stays *resident*: both workers keep its KV, its
reservation stays counted, and readmission resumes it without any worker
call. When the reservations of running + resident requests would exceed
``max_tokens_in_flight`` (KV pressure), resident requests are evicted, the
policy's last-ranked first: released on both workers and later re-prefilled
with prompt + output so far (recompute). Either way the output is what an
uninterrupted run produces: the target continues from exactly the committed
tokens (greedy; with sampling the per-step randomness may differ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from scheduler.policies.queue import Capacity, QueuePolicy, reserved_tokens
from scheduler.report import StepReport
from scheduler.request import Request, RequestState


class ForgetsRequests(Protocol):
    def forget(self, req: Request) -> None: ...  # the draft side drops the request (DraftLink.forget)


class AdmissionConfig(Protocol):
    max_batch_size: int
    keep_kv_on_preempt: bool


class AdmissionControl:
    def __init__(
        self,
        queue_policy: QueuePolicy,
        config: "AdmissionConfig",
        draft: ForgetsRequests,
        release_target: Callable[[str], None],
    ) -> None:
        self.queue_policy = queue_policy
        self.config = config  # read live: an operator (or a test) may change the caps on a running loop
        self.draft = draft
        self.release_target = release_target  # queues a target release for the next flush

    def admit(
        self, waiting: list[Request], running: dict[str, Request], budget: int, now: float, report: StepReport
    ) -> list[Request]:
        """Move admitted requests from ``waiting`` to ``running``; returns those that need a prefill."""
        capacity = Capacity(self.config.max_batch_size, budget)
        adm = self.queue_policy.schedule(list(waiting), list(running.values()), capacity, now)
        for req in adm.preempt:
            if req.id in running:
                self.preempt(req, waiting, running)
                report.preempted_ids.append(req.id)
                if not req.resident:
                    report.evicted_ids.append(req.id)
        # the policy proposes, the loop enforces the caps (its own reservations only: resident
        # requests' blocks are reclaimable, below)
        num = len(running)
        tokens = sum(reserved_tokens(r) for r in running.values())
        new = []
        for req in adm.admit:
            if req not in waiting or req.id in report.preempted_ids:
                continue
            if num >= self.config.max_batch_size or tokens + reserved_tokens(req) > budget:
                break
            waiting.remove(req)
            req.state = RequestState.RUNNING
            running[req.id] = req
            if req.resident:
                req.resident = False  # resumed: both workers still hold everything it committed
                report.resumed_ids.append(req.id)
            else:
                new.append(req)
            num += 1
            tokens += reserved_tokens(req)
        # KV pressure: resident requests keep their blocks only while everything fits
        resident = [r for r in waiting if r.resident]
        excess = tokens + sum(reserved_tokens(r) for r in resident) - budget
        if excess > 0:
            for req in reversed(self.queue_policy.order(resident, now)):
                if excess <= 0:
                    break
                self.evict(req)
                report.evicted_ids.append(req.id)
                excess -= reserved_tokens(req)
        return new

    def preempt(self, req: Request, waiting: list[Request], running: dict[str, Request]) -> None:
        del running[req.id]
        req.state = RequestState.WAITING
        req.num_preemptions += 1
        waiting.append(req)
        if self.config.keep_kv_on_preempt:
            req.resident = True
        else:
            self.evict(req)

    def evict(self, req: Request) -> None:
        """Release a waiting request's KV on both workers; it is prefilled again (prompt + output) on readmission."""
        req.resident = False
        self.release_target(req.id)
        self.draft.forget(req)
        req.num_recomputes += 1
