"""Elastic draft memory, the loop's side (Nightjar §5.1): act on ElasticDraftMemory's decisions.

After each step the loop reports whether anything speculated and how much
of the KV token budget is reserved; when the policy (policies/elastic_memory.py)
says offload, the draft drops every sequence and its weights go to host
memory; when it says reload, they come back. With ``pool_growth`` the
target's KV pool takes the draft's space while it is away::

    offload:  draft.offload() ──▶ target.resize_kv(base + extra) ──▶ budget += extra tokens
    reload:   target.resize_kv(base) ──▶ budget -= extra tokens ──▶ draft.reload()
              (refused while a sequence owns an extra block: the draft stays offloaded, retried later)

The pool changes first, then the budget: a grown budget never precedes its
blocks, and a refused shrink leaves both as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from scheduler.draft_link import DraftLink
from scheduler.policies.elastic_memory import Action, ElasticDraftMemory, PoolGrowth
from scheduler.report import StepReport
from scheduler.request import Request
from scheduler.workers import TargetWorker

log = logging.getLogger(__name__)


class ElasticControl:
    def __init__(self, memory: ElasticDraftMemory, config, target: TargetWorker, link: DraftLink) -> None:
        """``config``: the loop's SchedulerConfig; its ``pool_growth`` is read at each resize."""
        self.memory = memory
        self.config = config
        self.target = target
        self.link = link
        self.extra_tokens = 0  # budget the grown pool adds while the draft is offloaded

    async def after_step(
        self, *, speculated: bool, reserved: int, cap: int, num_waiting: int, holders: Iterable[Request],
        report: StepReport,
    ) -> None:  # fmt: skip
        """``cap``: the budget with the draft resident (also while the pool is grown)."""
        if not self.link.up:  # a failed draft is the failure path's business
            return
        action = self.memory.observe(
            speculated=speculated, free_share=max(0.0, 1.0 - reserved / cap), num_waiting=num_waiting
        )
        if action is not None:
            await self._act(action, reserved, cap, list(holders), report)

    async def _act(self, action: Action, reserved: int, cap: int, holders: list[Request], report: StepReport) -> None:
        # the target gives the draft's space back before the draft loads into it
        if action == "reload" and not await self._resize(False, reserved, cap, report):
            self.memory.failed(action)  # stays offloaded; tried again after retry_steps
            return
        call = getattr(self.link.worker, action, None)
        try:
            if call is None:
                raise NotImplementedError(f"the draft worker has no {action}()")
            await call()
        except Exception as exc:  # noqa: BLE001 - the draft stays as it was; requests go on either way
            permanent = isinstance(exc, NotImplementedError) or getattr(exc, "grpc_code", "") == "UNIMPLEMENTED"
            log.warning("draft %s failed (%s)%s", action, exc, "; elastic memory off" if permanent else "")
            self.memory.failed(action, permanent=permanent)
            if action == "reload":  # still offloaded: its space is the target's again
                await self._resize(True, reserved, cap, report)
            return
        self.memory.done(action)
        report.draft_memory_event = action
        if action == "offload":
            self.link.offloaded_all(holders)  # the draft dropped them; the resync prefill brings them back
            log.info("draft offloaded (KV pressure, no speculation)")
            await self._resize(True, reserved, cap, report)
        else:
            self.link.offloaded = False
            log.info("draft reloaded (queue empty, KV budget free)")

    async def _resize(self, grow: bool, reserved: int, cap: int, report: StepReport) -> bool:
        """Grow the target's KV pool into the offloaded draft's space, or shrink it back; False when refused."""
        growth: PoolGrowth | None = self.config.pool_growth
        if growth is None or (self.extra_tokens > 0) == grow:
            return True
        event = "grow" if grow else "shrink"
        if not grow and reserved > cap:
            log.info("KV pool not shrunk: reservations exceed the budget without the grown blocks")
            report.kv_pool_event = "shrink-refused"
            return False
        resize = getattr(self.target, "resize_kv", None)
        num_blocks = growth.base_blocks + (growth.extra_blocks if grow else 0)
        try:
            if resize is None:
                raise NotImplementedError("the target worker has no resize_kv()")
            await resize(num_blocks)
        except Exception as exc:  # noqa: BLE001 - the pool stays as it was; requests go on either way
            (log.warning if grow else log.info)("KV pool %s failed (%s)", event, exc)
            report.kv_pool_event = "grow-failed" if grow else "shrink-refused"
            return False
        self.extra_tokens = growth.extra_tokens if grow else 0
        report.kv_pool_event = event
        log.info("KV pool %s: token budget %d", event, cap + self.extra_tokens)
        return True
