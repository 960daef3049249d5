"""Preemptive request order (LAPS-SD, LAS) over real gRPC, tiny models and Redis.

Two long requests run first (batch cap 2); short ones arrive while they run
and, being in a higher queue (less attained service), displace them. The
displaced requests either keep their KV on both model services and resume,
or are released and re-prefilled with prompt + output so far (recompute).
Either way every output is the target's greedy output, and when the load is
over no sequence or KV block is left on either service.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from sdk import Client, FinishReason
from tests.support.tiny_stack import SPEC_K, VOCAB


@contextmanager
def scheduler_for(stack, target_dir, queue_policy: str, **settings) -> Iterator:
    """A second scheduler over the stack's target and draft, with ``queue_policy``."""
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    running = stack.loop.run(
        start(
            ServiceSettings(
                port=0, trace_exporter="none", shutdown_grace_s=0.5, model=str(target_dir), target_addr=stack.target.address,
                draft_addr=stack.draft.address, redis_url=stack.redis_url, speculation_policy=f"fixed:{SPEC_K}",
                queue_policy=queue_policy, **settings,
            )  # fmt: skip
        )
    )
    try:
        yield running
    finally:
        stack.loop.run(running.stop())


class Preemptions:
    """IterationObserver counting preemptions and resumptions."""

    def __init__(self) -> None:
        self.preempted: list[str] = []
        self.resumed: list[str] = []
        self.prefilled: list[str] = []
        self.last_step = -1

    def on_step(self, report) -> None:
        self.last_step = report.step
        self.preempted += report.preempted_ids
        self.resumed += report.resumed_ids
        self.prefilled += report.prefilled_ids

    def on_finish(self, request) -> None:
        pass


def _kv_state(stack, running) -> tuple:
    target = stack.loop.run(running.servicer.target_info())
    draft = stack.loop.run(running.servicer.draft_info())
    return (target.num_live_seqs, draft.num_live_seqs, target.kv_blocks_total - target.kv_blocks_free,
            draft.kv_blocks_total - draft.kv_blocks_free)  # fmt: skip


def _wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# gamma=1000: acceptance never counts as stable, so the long requests stay preemptible
POLICIES = ["laps-sd:s1=0.02,gamma=1000", "las:0.02"]


@pytest.mark.parametrize("keep_kv", [True, False], ids=["keep-kv", "recompute"])
@pytest.mark.parametrize("policy", POLICIES, ids=["laps-sd", "las"])
def test_preempted_requests_are_lossless_and_leak_nothing(stack, tiny_pair, reference, policy, keep_kv):
    rng = random.Random(5)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))] for _ in range(6)]
    lengths = [80, 80, 6, 6, 8, 8]
    with scheduler_for(stack, tiny_pair[0], policy, max_batch_size=2) as running:
        running.scheduler.config.keep_kv_on_preempt = keep_kv
        seen = Preemptions()
        running.scheduler.add_observer(seen)
        with Client(running.address, timeout=120) as client, ThreadPoolExecutor(6) as pool:
            long = [pool.submit(client.generate, p, max_new_tokens=n) for p, n in zip(prompts[:2], lengths[:2])]
            _wait(lambda: len(seen.prefilled) >= 2 and running.scheduler.num_steps > 10)  # both long ones ran a while
            short = [pool.submit(client.generate, p, max_new_tokens=n) for p, n in zip(prompts[2:], lengths[2:])]
            results = [f.result(timeout=120) for f in long + short]
        # a request's last tokens stream before the observers hear of its step
        _wait(lambda: not running.scheduler.has_work() and seen.last_step == running.scheduler.num_steps - 1)
        for p, n, r in zip(prompts, lengths, results):
            assert r.finish_reason == FinishReason.LENGTH
            assert r.token_ids == reference.greedy(p, n)
        assert set(seen.preempted) & {r.request_id for r in results[:2]}, "the long requests were never preempted"
        if keep_kv:
            assert seen.resumed and len(seen.prefilled) == len(prompts)  # resumed without a prefill
        else:
            assert not seen.resumed and len(seen.prefilled) == len(prompts) + len(seen.preempted)
        _wait(lambda: _kv_state(stack, running) == (0, 0, 0, 0))  # releases flush at the end of a step
