"""The loop's side of the draft service: may it be used, what may it still hold, when to try it again,
and how requests get (back) onto it (architecture.md §4: a failed draft degrades to plain decoding).

    up ──a call fails──▶ down (every request it held is now "stale": released on recovery)
     ▲                     │ backoff: retry_initial_s, doubling up to retry_max_s
     └──probe after the backoff; the next sync (release stale, re-prefill) tells whether it is back

``sync`` runs before every speculate: it releases what the draft may still
hold for requests it lost track of, and re-prefills each speculating request
it does not hold with everything but its last token (which then goes in as
the speculate call's new token). A feature-level draft is re-prefilled with
target features (``FeatureRelay.resync``). Releases of ended requests are
queued and flushed between calls, never while a draft call is in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from scheduler.feature_relay import FeatureRelay
from scheduler.request import Request, RequestState
from scheduler.workers import Clock, DraftWorker, TargetWorker
from shared.engine.types import PrefillItem

log = logging.getLogger(__name__)


class DraftLink:
    def __init__(
        self,
        draft: DraftWorker | None,
        clock: Clock,
        *,
        retry_initial_s: float,
        retry_max_s: float,
        target: TargetWorker,
        features: FeatureRelay | None = None,
    ) -> None:
        self.worker = draft
        self.clock = clock
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.target = target
        self.features = features
        self.up = draft is not None
        self.offloaded = False  # weights in host memory (elastic memory): it holds nothing
        self.stale: set[str] = set()  # ids it may hold that no request tracks there
        self.pending_release: list[str] = []
        self.retry_at = 0.0
        self.backoff = 0.0  # 0 = not failing
        self.error: str | None = None  # this step's

    @property
    def usable(self) -> bool:
        return self.up and not self.offloaded

    def begin_step(self) -> None:
        self.error = None

    def probe(self) -> None:
        """After the backoff, let the next sync try the draft again."""
        if self.worker is not None and not self.up and self.clock.now() >= self.retry_at:
            self.up = True

    def failed(self, exc: Exception, holders: Iterable[Request], also_stale: Iterable[str] = ()) -> None:
        """A draft call failed: down until the backoff passes; whatever it held is unknown now."""
        self.backoff = self.retry_initial_s if self.backoff == 0 else min(2 * self.backoff, self.retry_max_s)
        self.retry_at = self.clock.now() + self.backoff
        self.error = f"{type(exc).__name__}: {exc}"
        if self.up:
            log.warning("draft failed (%s); plain decoding, retry in %.2fs", self.error, self.backoff)
        self.up = False
        self.stale.update(also_stale)
        for req in holders:  # running and resident requests
            if self.features is not None and req.features is not None and req.features.pushed:
                req.features = None  # pushed rows a restarted draft no longer has: recomputed at the resync
            req.draft_rollback = 0
            if req.on_draft:
                req.on_draft = False
                self.stale.add(req.id)

    def recovered(self) -> None:
        self.backoff = 0.0

    def mark(self, req: Request, num_seen: int) -> None:
        """The draft now holds ``num_seen`` tokens of ``req`` (released at once if it ended meanwhile)."""
        req.draft_rollback = 0
        if req.state is RequestState.RUNNING:
            req.on_draft, req.draft_seen = True, num_seen
        else:
            self.pending_release.append(req.id)

    def forget(self, req: Request) -> None:
        """The request ended or was evicted: release it on the draft at the next flush."""
        req.draft_rollback = 0
        if req.on_draft:
            self.pending_release.append(req.id)
            req.on_draft = False

    def drop(self, req: Request) -> None:
        """Forget that the draft holds ``req`` without a release (its state there must not be trusted)."""
        req.draft_rollback = 0
        if req.on_draft:
            req.on_draft = False
            self.stale.add(req.id)

    def offloaded_all(self, holders: Iterable[Request]) -> None:
        """The draft dropped every sequence (weights offloaded): nothing to release, everything to re-prefill."""
        self.offloaded = True
        for req in holders:
            req.on_draft = False
            req.draft_rollback = 0
        self.stale.clear()

    async def flush(self, holders: Iterable[Request]) -> None:
        if not self.pending_release:
            return
        ids, self.pending_release = self.pending_release, []
        if not self.up:
            self.stale.update(ids)
            return
        try:
            await self.worker.release(ids)
        except Exception as exc:  # noqa: BLE001 - the draft is down; the ids are released on recovery
            self.failed(exc, holders, also_stale=ids)

    async def release_stale_when_idle(self, wakeup: asyncio.Event) -> None:
        """The loop idles with ids a failed draft may still hold (``stale``): once the retry time comes (or at
        once, if the draft is up), release them, as ``sync`` would before the next speculate, so a failure at
        the end of the traffic leaves nothing on the draft. Returns early when ``wakeup`` is set (work came:
        its steps resync as usual); a failed release counts as a failure (the backoff grows)."""
        delay = 0.0 if self.up else max(0.0, self.retry_at - self.clock.now())
        if delay:
            woken = asyncio.ensure_future(wakeup.wait())
            slept = asyncio.ensure_future(self.clock.sleep(delay))
            await asyncio.wait((woken, slept), return_when=asyncio.FIRST_COMPLETED)
            for task in (woken, slept):
                task.cancel()
            if wakeup.is_set():
                return
            self.probe()
        ids = sorted(self.stale)
        try:
            await self.worker.release(ids)
        except Exception as exc:  # noqa: BLE001 - still down: tried again after the (longer) backoff
            self.failed(exc, ())
            return
        self.stale.difference_update(ids)
        self.recovered()

    async def sync(self, requests: list[Request]) -> None:
        """Before a speculate: release stale ids, re-prefill the requests the draft does not hold. Raises."""
        if self.stale:
            await self.worker.release(sorted(self.stale))
            self.stale.clear()
        resync = [r for r in requests if not r.on_draft]
        if not resync:
            return
        try:
            if self.features is not None:
                await self.features.resync(resync, self.target, self.worker)
            else:
                items = [PrefillItem(r.id, r.tokens()[:-1], r.sampling, cache_salt=r.cache_salt, grammar=r.grammar)
                         for r in resync]  # fmt: skip
                await self.worker.prefill(items)
        except Exception:
            self.stale.update(r.id for r in resync)
            raise
        for r in resync:
            self.mark(r, r.num_tokens - 1)
