"""Chunked prefill and prefix caching through the scheduler loop over in-process engines: greedy output is
the same with chunks on or off at several sizes, the cache warm or cold, speculation on or off, and across
a target restart and a draft failure while a chunked prefill is in flight."""

from __future__ import annotations

import asyncio
import random

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.speculation import FixedChain, NoSpeculation
from scheduler.request import Request
from scheduler.target_link import TargetRecoveryConfig
from scheduler.workers import NullObserver
from shared.engine.config import EngineConfig
from shared.engine.factory import build_draft_engine, build_target_engine

from test_local_workers import draft_dir, greedy  # noqa: F401 - draft_dir is a fixture

RNG = random.Random(5)
SHARED = [RNG.randrange(200) for _ in range(21)]  # a common system prompt: the cache's hits
PROMPTS = [SHARED + [RNG.randrange(200) for _ in range(n)] for n in (9, 2, 17)] + [[7, 8, 9]]
NEW_TOKENS = [8, 11, 6, 9]


def engines(model_dir, draft_model_dir, *, cache: bool):
    config = EngineConfig(num_blocks=96, block_size=4, prefix_caching=cache)
    target, _ = build_target_engine(model_dir, device="cpu", engine_config=config)
    draft, _ = build_draft_engine(draft_model_dir, device="cpu", engine_config=config)
    return target, draft


def run(sched, reqs) -> list[list[int]]:
    async def main():
        streams = [sched.submit(r) for r in reqs]
        _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
        return outs

    return asyncio.run(main())


def requests(tag: str) -> list[Request]:
    return [Request(f"{tag}{i}", list(p), max_new_tokens=n) for i, (p, n) in enumerate(zip(PROMPTS, NEW_TOKENS))]


@pytest.fixture(scope="module")
def expected(tiny_model_dir):
    return [greedy(tiny_model_dir, p, n) for p, n in zip(PROMPTS, NEW_TOKENS)]


@pytest.mark.parametrize("chunk", [0, 5, 8, 16])
@pytest.mark.parametrize("cache", [False, True], ids=["cold", "cache"])
@pytest.mark.parametrize("spec", ["none", "chain3"])
def test_chunked_prefill_through_the_loop_is_greedy_exact(tiny_model_dir, draft_dir, expected, chunk, cache, spec):
    target, draft = engines(tiny_model_dir, draft_dir, cache=cache)
    policy = FixedChain(3) if spec == "chain3" else NoSpeculation()
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=policy,
                      config=SchedulerConfig(prefill_chunk=chunk))  # fmt: skip
    for turn in range(2):  # the second round runs the same prompts again: warm when the cache is on
        assert run(sched, requests(f"t{turn}-")) == expected
    if chunk:
        assert sched.chunks.num_chunks >= 3 and not sched.chunks.active
    if cache:
        assert target.runner.cache.allocator.prefix.hits > 0
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert not engine.runner.seqs


class RestartingTarget(LocalTargetWorker):
    """Loses every sequence (a restart: fresh engine state) on its ``crash_at``-th step call, answering UNAVAILABLE."""

    def __init__(self, engine, crash_at: int) -> None:
        super().__init__(engine)
        self.calls, self.crash_at, self.crashes = 0, crash_at, 0

    async def step(self, prefills, verifies):
        self.calls += 1
        if self.calls == self.crash_at:
            self.crashes += 1
            self.engine.release(list(self.engine.runner.seqs))  # a restarted service holds nothing
            raise _Unavailable("target restarted")
        return await super().step(prefills, verifies)

    async def info(self):
        return "up"


class _Unavailable(ConnectionError):
    grpc_code = "UNAVAILABLE"


@pytest.mark.parametrize("crash_at", [1, 2, 3])
def test_a_target_restart_during_a_chunked_prefill_changes_no_token(tiny_model_dir, draft_dir, expected, crash_at):
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    worker = RestartingTarget(target, crash_at)
    config = SchedulerConfig(prefill_chunk=6, target_recovery=TargetRecoveryConfig(recovery_s=30, backoff_s=0.01))
    sched = Scheduler(worker, LocalDraftWorker(draft), spec_policy=FixedChain(2), config=config)
    assert run(sched, requests("r")) == expected
    assert worker.crashes == 1 and sched.target_link.num_recoveries == 1
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert not engine.runner.seqs


class FailingDraft(LocalDraftWorker):
    """Its ``fail_at``-th prefill call fails and loses every sequence (a draft restart)."""

    def __init__(self, engine, fail_at: int) -> None:
        super().__init__(engine)
        self.calls, self.fail_at = 0, fail_at

    async def prefill(self, items):
        self.calls += 1
        if self.calls == self.fail_at:
            self.engine.release(list(self.engine.runner.seqs))
            raise ConnectionError("draft restarted")
        return await super().prefill(items)


@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_draft_restart_during_a_chunked_prefill_changes_no_token(tiny_model_dir, draft_dir, expected, fail_at):
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    worker = FailingDraft(draft, fail_at)
    config = SchedulerConfig(prefill_chunk=6, draft_retry_initial_s=0.0, draft_retry_max_s=0.0)
    sched = Scheduler(LocalTargetWorker(target), worker, spec_policy=FixedChain(2), config=config)
    assert run(sched, requests("r")) == expected
    assert worker.calls > fail_at  # it came back and took prefills again
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert not engine.runner.seqs


class Steps(NullObserver):
    def __init__(self):
        self.batched: list[int] = []

    def on_step(self, report):
        self.batched.append(len(report.prefilled_ids))


def test_running_requests_keep_decoding_while_a_long_prompt_prefills(tiny_model_dir, draft_dir):
    """Chunks join the verify forward: the short request emits a token every step of the long one's prefill."""
    target, draft = engines(tiny_model_dir, draft_dir, cache=False)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=NoSpeculation(),
                      config=SchedulerConfig(prefill_chunk=8))  # fmt: skip
    short = Request("short", [1, 2, 3], max_new_tokens=30)
    long = Request("long", list(range(10, 90)), max_new_tokens=2)

    async def main():
        s1 = sched.submit(short)
        await sched.step()  # short is decoding
        s2 = sched.submit(long)
        _, *outs = await asyncio.gather(sched.run_until_idle(), s1.collect(), s2.collect())
        return outs

    run_outs = asyncio.run(main())
    assert run_outs[1] == greedy(tiny_model_dir, long.prompt_ids, 2)
    first_long = long.first_token_time
    during = [t for t in short.token_times if t < first_long]
    assert len(during) >= 80 // 8  # one token per chunk step at least
