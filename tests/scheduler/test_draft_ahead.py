"""Draft run-ahead over in-process engines: the trees drafted ahead are taken, output equals serial SD and
target-only greedy, changed plans and failed calls fall back to drafting in the step."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.draft_ahead import DraftAhead
from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.adaserve import SpecInferTree
from scheduler.policies.speculation import FixedChain, SpeculationPolicy
from scheduler.request import Request, RequestState
from scheduler.spec_shape import SpecShape
from shared.engine.config import EngineConfig
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.types import AcceptResult, TokenTree

from test_local_workers import greedy, serve_prompts


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    from shared.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("models") / "tiny-draft", "llama", num_layers=1, seed=1)


class Alternating(SpeculationPolicy):
    """Chains of 2 and 3 tokens in turn: every plan differs from the one before (each tree sent ahead misses)."""

    name = "alternating"

    def __init__(self) -> None:
        self.calls = 0

    def decide(self, batch, ctx):
        self.calls += 1
        return [SpecShape.chain(2 + self.calls % 2)] * len(batch)


class FailingDraft(LocalDraftWorker):
    """Its speculate calls fail from the ``fail_at``-th on, ``times`` times."""

    def __init__(self, engine, fail_at: int, times: int = 1) -> None:
        super().__init__(engine)
        self.calls, self.fail_at, self.times = 0, fail_at, times

    async def speculate(self, items):
        self.calls += 1
        if self.fail_at <= self.calls < self.fail_at + self.times:
            raise ConnectionError("draft gone")
        return await super().speculate(items)


def run(target_dir, draft_dir, policy, *, ahead: bool, draft_worker=LocalDraftWorker, retry_s: float = 0.0):
    config = EngineConfig(num_blocks=128, block_size=4)
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=config)
    draft, _ = build_draft_engine(draft_dir, device="cpu", engine_config=config)
    sched = Scheduler(
        LocalTargetWorker(target),
        draft_worker(draft),
        spec_policy=policy,
        config=SchedulerConfig(draft_ahead=ahead, draft_retry_initial_s=retry_s, draft_retry_max_s=retry_s),
    )
    reqs, outs = serve_prompts(sched, (target, draft))
    return reqs, outs, sched


@pytest.mark.parametrize("agreeing", [True, False], ids=["agreeing-draft", "garbage-draft"])
@pytest.mark.parametrize("policy", [lambda: FixedChain(4), lambda: SpecInferTree((2, 2))], ids=["chain4", "tree6"])
def test_output_equals_serial_and_target_only(tiny_model_dir, draft_dir, agreeing, policy):
    d = tiny_model_dir if agreeing else draft_dir
    reqs, outs, sched = run(tiny_model_dir, d, policy(), ahead=True)
    _, serial, plain = run(tiny_model_dir, d, policy(), ahead=False)
    assert plain.ahead is None
    for req, out, ser in zip(reqs, outs, serial):
        assert out == ser == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.ahead.num_hits > 0 and sched.ahead.num_misses == 0  # a fixed policy: every plan as sent
    assert sched.ahead.num_hits <= sched.ahead.num_sent
    assert not sched.ahead.pending


def test_changed_plans_miss_and_are_drafted_in_the_step(tiny_model_dir):
    reqs, outs, sched = run(tiny_model_dir, tiny_model_dir, Alternating(), ahead=True)
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.ahead.num_misses > sched.ahead.num_hits  # only where the cap near the end makes plans agree


def test_a_failed_call_sent_ahead_is_a_draft_failure(tiny_model_dir):
    # the 2nd speculate is the first sent ahead (the 1st ran in the step): it fails, the loop decodes plainly,
    # then resynchronises the draft and speculates again
    reqs, outs, sched = run(tiny_model_dir, tiny_model_dir, FixedChain(3), ahead=True,
                            draft_worker=lambda e: FailingDraft(e, fail_at=2))  # fmt: skip
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.draft.calls > 2 and sched.ahead.num_hits > 0


# ---------------------------------------------------------------- the bookkeeping alone


class _Draft:
    def __init__(self) -> None:
        self.items = []

    async def speculate(self, items):
        self.items.append(items)
        return [TokenTree.chain([9] * it.chain_len) for it in items]


def _running(rid: str, num_tokens: int = 5, output: int = 1) -> Request:
    req = Request(id=rid, prompt_ids=list(range(1, num_tokens - output + 1)), max_new_tokens=50)
    req.output_ids = [7] * output
    req.state = RequestState.RUNNING
    req.on_draft, req.draft_seen = True, req.num_tokens
    return req


def _result(tokens: list[int]) -> AcceptResult:
    return AcceptResult(list(range(len(tokens) - 1)), tokens, [1] * (len(tokens) - 1))


def test_bookkeeping_hit_miss_and_requests_reset_meanwhile():
    async def main():
        ahead, draft = DraftAhead(), _Draft()
        a, b, c = _running("a"), _running("b"), _running("c")
        chain = SpecShape.chain(3)
        ahead.start(draft, [a, b, c], [chain] * 3, [_result([4, 5]), _result([6]), _result([8, 8, 8])])
        await asyncio.sleep(0)  # the call leaves
        assert ahead.pending and [it.new_tokens for it in draft.items[0]] == [[4, 5], [6], [8, 8, 8]]
        for req, toks in ((a, [4, 5]), (b, [6]), (c, [8, 8, 8])):  # the commit
            req.output_ids += toks
        c.on_draft = False  # dropped meanwhile (a failure elsewhere): its tree is not trusted
        trees = await ahead.collect()
        assert set(trees) == {"a", "b"} and a.draft_seen == a.num_tokens and c.draft_seen == 5
        assert ahead.take(a, chain, trees) is not None  # planned as sent: a hit
        assert ahead.take(b, SpecShape.chain(2), trees) is None  # planned otherwise: drafted again, last token re-fed
        assert (b.draft_seen, b.draft_rollback) == (b.num_tokens - 1, 1)
        assert (ahead.num_sent, ahead.num_hits, ahead.num_misses) == (3, 1, 1)

    asyncio.run(main())


def test_a_stop_that_cut_the_commit_short_is_rolled_back():
    async def main():
        ahead, draft = DraftAhead(), _Draft()
        a = _running("a")
        ahead.start(draft, [a], [SpecShape.chain(2)], [_result([4, 5, 6])])
        a.output_ids += [4]  # a stop after the first token (a preempted resident request keeps its KV)
        assert await ahead.collect() == {}
        assert (a.draft_seen, a.draft_rollback) == (a.num_tokens, 2)

    asyncio.run(main())


def test_requests_that_end_with_the_commit_or_did_not_speculate_are_not_sent():
    async def main():
        ahead, draft = DraftAhead(), _Draft()
        ending = _running("end")
        ending.max_new_tokens = 3
        plain = _running("plain")
        ahead.start(draft, [ending, plain], [SpecShape.chain(2), SpecShape.none()], [_result([1, 2]), _result([3])])
        assert not ahead.pending and not draft.items

    asyncio.run(main())


def test_misses_pause_the_run_ahead_and_the_pause_doubles():
    ahead = DraftAhead(window=4, max_miss=0.25, pause_steps=2, max_pause_steps=8)
    for _ in range(4):
        ahead.gate.record(False)
    assert ahead.paused == 2
    for _ in range(4):
        ahead.gate.record(False)
    assert ahead.paused == 4
    for _ in range(4):
        ahead.gate.record(True)
    assert ahead.gate._next_pause == 2
    assert [ahead.gate.open() for _ in range(5)] == [False] * 4 + [True]  # paused steps count down
