"""The scheduler's view of the target's health: an outage is waited out, not passed on to clients.

    verify / prefill fails with an outage code ─▶ lost(now): down since now
        the loop moves every request the target held back to the queue (their committed
        tokens stay with them) and admits nothing
    each step while down ─▶ probe(now): Info, at most every ``backoff`` (doubling up to ``max_backoff_s``)
        answers  ─▶ up again: the loop releases the old sequence ids (idempotent: a restarted target
                    holds none, a hung one that came back frees them) and re-prefills prompt + output,
                    exactly as after a recompute preemption, so greedy output is unchanged
        silent past ``recovery_s`` ─▶ expired: the loop ends the waiting requests with UNAVAILABLE
                    and the tokens they already have

What counts as an outage (``is_outage``): the service is unreachable or timed out (UNAVAILABLE,
DEADLINE_EXCEEDED, CANCELLED), or it no longer knows a sequence the scheduler holds live
(NOT_FOUND: it restarted between two steps). Any other error is the request's own and fails it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

OUTAGE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "NOT_FOUND"})


class TargetRecoveryConfig(BaseModel):
    recovery_s: float = Field(
        60.0, ge=0.0, description="How long requests wait for a target that is down (0 = fail them at once)."
    )
    backoff_s: float = Field(0.1, gt=0.0, description="First wait between probes of a target that is down.")
    max_backoff_s: float = Field(2.0, gt=0.0, description="Longest wait between probes.")


def status_name(exc: BaseException | None) -> str | None:
    """The gRPC status name an error carries (``grpc_code``, or an AioRpcError's ``code()``), else None."""
    if exc is None:
        return None
    code = getattr(exc, "grpc_code", None)
    if isinstance(code, str):
        return code
    code_fn = getattr(exc, "code", None)
    if callable(code_fn):
        try:
            return getattr(code_fn(), "name", None)
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return None
    return None


def error_status(exc: BaseException | None) -> str:
    """The status name a failed request carries: the error's own, UNAVAILABLE for connection trouble, else INTERNAL."""
    name = status_name(exc)
    if name is not None:
        return name
    if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
        return "UNAVAILABLE"
    return "INTERNAL"


class TargetLink:
    def __init__(self, probe: Callable[[], Awaitable[object]] | None, config: TargetRecoveryConfig | None = None):
        """``probe``: a cheap call that succeeds only when the target serves (its Info); None = no recovery."""
        self.config = config or TargetRecoveryConfig()
        self._probe = probe
        self.down_since: float | None = None
        self._next_probe = 0.0
        self._backoff = self.config.backoff_s
        self.num_outages = 0
        self.num_recoveries = 0

    @property
    def up(self) -> bool:
        return self.down_since is None

    def is_outage(self, exc: BaseException | None) -> bool:
        unreachable = status_name(exc) in OUTAGE_CODES or isinstance(exc, ConnectionError)
        return self._probe is not None and self.config.recovery_s > 0 and unreachable

    def lost(self, now: float, exc: BaseException | None = None) -> None:
        if self.down_since is not None:
            return
        self.down_since = now
        self._next_probe = now
        self._backoff = self.config.backoff_s
        self.num_outages += 1
        log.warning("target unreachable (%s); holding its requests for up to %.0f s", exc, self.config.recovery_s)

    def restart_window(self, now: float) -> None:
        """Still down, but the requests that waited have been failed: the next ones get a window of their own."""
        if self.down_since is not None:
            self.down_since = now

    def expired(self, now: float) -> bool:
        return self.down_since is not None and now - self.down_since > self.config.recovery_s

    def wait_s(self, now: float) -> float:
        """How long the loop may sleep before the next probe is due."""
        return max(0.0, self._next_probe - now)

    async def probe(self, now: float) -> bool:
        """Probe if one is due; True once the target answers (it is up again)."""
        if self.down_since is None:
            return True
        if now < self._next_probe:
            return False
        try:
            await self._probe()
        except Exception as exc:  # noqa: BLE001 - any failure means still down
            self._next_probe = now + self._backoff
            self._backoff = min(self.config.max_backoff_s, self._backoff * 2)
            log.debug("target still down: %s", exc)
            return False
        log.warning("target answers again after %.1f s; re-prefilling its requests", now - self.down_since)
        self.down_since = None
        self.num_recoveries += 1
        return True
