"""TargetLink: which errors are outages, probing with backoff, the recovery bound."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.target_link import TargetLink, TargetRecoveryConfig, status_name
from shared.engine.errors import InvalidRequestError, UnknownSequenceError


class Coded(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.grpc_code = code


class Probe:
    def __init__(self) -> None:
        self.up = False
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if not self.up:
            raise ConnectionError("refused")


def test_outages_are_unreachable_timed_out_or_forgotten_sequences():
    link = TargetLink(Probe())
    for code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "NOT_FOUND"):
        assert link.is_outage(Coded(code)), code
    assert link.is_outage(UnknownSequenceError("gone"))  # the engine's NOT_FOUND
    for exc in (Coded("INVALID_ARGUMENT"), InvalidRequestError("bad"), RuntimeError("bug"), None):
        assert not link.is_outage(exc)
    assert status_name(Coded("UNAVAILABLE")) == "UNAVAILABLE" and status_name(ValueError()) is None
    assert not TargetLink(None).is_outage(Coded("UNAVAILABLE"))  # no probe: no recovery
    assert not TargetLink(Probe(), TargetRecoveryConfig(recovery_s=0)).is_outage(Coded("UNAVAILABLE"))


def test_probes_back_off_until_the_target_answers():
    probe = Probe()
    link = TargetLink(probe, TargetRecoveryConfig(recovery_s=10, backoff_s=0.1, max_backoff_s=0.4))

    async def scenario() -> None:
        assert link.up and await link.probe(0.0)
        link.lost(1.0, Coded("UNAVAILABLE"))
        link.lost(1.5)  # already down: the first loss counts
        assert not link.up and link.down_since == 1.0 and link.num_outages == 1
        assert not await link.probe(1.0) and probe.calls == 1
        assert not await link.probe(1.05) and probe.calls == 1  # not due yet
        assert link.wait_s(1.05) == pytest.approx(0.05)
        times = [1.1, 1.31, 1.71, 2.12, 2.53]  # due after 0.1, 0.2, 0.4, 0.4 (capped), ...
        for t in times:
            assert not await link.probe(t)
        assert probe.calls == 1 + len(times)
        probe.up = True
        assert await link.probe(3.0) and link.up and link.num_recoveries == 1

    asyncio.run(scenario())


def test_the_bound_expires_requests_waiting_for_a_dead_target():
    link = TargetLink(Probe(), TargetRecoveryConfig(recovery_s=5))
    assert not link.expired(100.0)
    link.lost(100.0)
    assert not link.expired(105.0) and link.expired(105.01)
