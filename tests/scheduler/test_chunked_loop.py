"""Chunked prefill and prefix caching through the scheduler loop over in-process engines: greedy output is
the same with chunks on or off at several sizes, the cache warm or cold, speculation on or off, and across
a target restart and a draft failure while a chunked prefill is in flight."""

from __future__ import annotations

import asyncio
import random

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.prefill_split import chunk_cost, pair_cost, tokens_within
from scheduler.policies.speculation import FixedChain, NoSpeculation
from scheduler.request import Request
from scheduler.target_link import TargetRecoveryConfig
from scheduler.workers import NullObserver
from shared.engine.config import EngineConfig
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.model_shape import model_shape
from shared.profiling.cost_model import CostModel

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


@pytest.mark.parametrize("chunk", [0, 8])
def test_a_profiled_loop_runs_with_chunking_on_or_off(tiny_model_dir, draft_dir, expected, chunk):
    """A deployed scheduler carries the target's profiled cost model and token budget; with chunking off
    (TANDEM_PREFILL_CHUNK=0, or a frontier loop) the step's split has nothing to do and must not price a
    chunk of 0 tokens."""
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    config = SchedulerConfig(prefill_chunk=chunk, token_budget=12,
                             cost_model=CostModel(alpha_s=1e-6, gamma_s=1e-4, delta_s=1e-3))  # fmt: skip
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=FixedChain(3), config=config)
    assert run(sched, requests("p")) == expected
    assert bool(sched.chunks.num_chunks) == bool(chunk)


@pytest.mark.parametrize("chunk", [64, 8], ids=["short-prompt", "long-prompt"])
def test_samples_of_one_prompt_share_its_prefill(tiny_model_dir, draft_dir, expected, chunk):
    """n samples (four requests of one prompt, admitted together): the first prefills, the others wait for it
    and take every full block from the target's prefix cache, so the prompt's full blocks are computed once;
    the output is each sample's own greedy answer."""
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=FixedChain(3),
                      config=SchedulerConfig(prefill_chunk=chunk))  # fmt: skip
    prompt, n = PROMPTS[0], NEW_TOKENS[0]  # 30 tokens: 7 full blocks of 4
    samples = [Request(f"s{i}", list(prompt), max_new_tokens=n) for i in range(4)]
    assert run(sched, samples) == [expected[0]] * 4
    full_blocks = (len(prompt) - 1) // 4 * 4  # a lookup never takes the block of the last prompt token
    assert target.runner.cache.allocator.prefix.hits >= 3 * full_blocks  # the three copies: all from the cache
    assert not sched.chunks.active
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert not engine.runner.seqs


def test_different_salts_do_not_share_a_prefill(tiny_model_dir, draft_dir, expected):
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=NoSpeculation(),
                      config=SchedulerConfig(prefill_chunk=64))  # fmt: skip
    samples = [Request(f"t{i}", list(PROMPTS[0]), max_new_tokens=NEW_TOKENS[0], cache_salt=f"tenant{i}")
               for i in range(2)]  # fmt: skip
    assert run(sched, samples) == [expected[0]] * 2
    assert target.runner.cache.allocator.prefix.hits == 0


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


@pytest.mark.parametrize("crash_at", [1, 2])
def test_samples_sharing_a_prefill_survive_a_target_restart(tiny_model_dir, draft_dir, expected, crash_at):
    """Re-admitted after the restart, the first sample starts over as the first (never waits on itself), and
    the copies wait for it again."""
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    worker = RestartingTarget(target, crash_at)
    config = SchedulerConfig(prefill_chunk=8, target_recovery=TargetRecoveryConfig(recovery_s=30, backoff_s=0.01))
    sched = Scheduler(worker, LocalDraftWorker(draft), spec_policy=FixedChain(2), config=config)
    samples = [Request(f"s{i}", list(PROMPTS[0]), max_new_tokens=NEW_TOKENS[0]) for i in range(3)]
    assert run(sched, samples) == [expected[0]] * 3
    assert worker.crashes == 1 and not sched.chunks.active
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


class ChunkRecorder(LocalTargetWorker):
    """Records every prefill chunk of a step call: (sequence, tokens granted, tokens in its KV afterwards)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.chunks: dict[str, list[tuple[int, int]]] = {}

    async def step(self, prefills, verifies):
        prefilled, verified = await super().step(prefills, verifies)
        for item, res in zip(prefills, prefilled):
            self.chunks.setdefault(item.seq_id, []).append((item.max_tokens, res.num_prefilled))
        return prefilled, verified


def test_chunks_beside_decoding_cost_alike_at_every_offset(tiny_model_dir, draft_dir):
    """Rule 1's cost cap through the loop: each chunk is the most tokens that cost(C, 0) pays for at the offset
    the target's KV (a cached prefix included) has reached; the output is the one-piece greedy one."""
    target, draft = engines(tiny_model_dir, draft_dir, cache=True)
    worker, r, c = ChunkRecorder(target), 0.02, 32
    sched = Scheduler(worker, LocalDraftWorker(draft), spec_policy=NoSpeculation(),
                      config=SchedulerConfig(prefill_chunk=c, prefill_pair_cost=r))  # fmt: skip
    short = Request("short", [1, 2, 3], max_new_tokens=40)
    a = Request("a", [RNG.randrange(200) for _ in range(64)], max_new_tokens=2)
    b = Request("b", a.prompt_ids + [RNG.randrange(200) for _ in range(40)], max_new_tokens=2)

    async def main():
        streams = [sched.submit(short)]
        await sched.step()  # short decodes from here on: every chunk runs beside it
        streams.append(sched.submit(a))
        while not a.state.done:
            await sched.step()
        streams.append(sched.submit(b))  # its first 64 tokens are in the target's prefix cache
        _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
        return outs

    outs = asyncio.run(main())
    assert outs == [greedy(tiny_model_dir, q.prompt_ids, q.max_new_tokens) for q in (short, a, b)]
    for req, offset in ((a, 0), (b, 64)):
        grants = worker.chunks[req.id]
        assert len(grants) >= 3 and grants[0][1] == offset + grants[0][0]
        for granted, done in grants:
            fits = max(16, tokens_within(chunk_cost(c, 0, r), offset, r))  # at least min_chunk (rule 4)
            assert granted == min(len(req.prompt_ids) - offset, fits)
            offset = done
        assert [g for g, _ in grants[:-1]] == sorted((g for g, _ in grants[:-1]), reverse=True)
    assert worker.chunks["a"][0][0] == c > worker.chunks["b"][0][0]  # b's first chunk attends the cached 64


def test_the_pair_cost_comes_from_the_targets_shape_by_default(tiny_model_dir, draft_dir):
    target, draft = engines(tiny_model_dir, draft_dir, cache=False)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), config=SchedulerConfig(prefill_chunk=8))
    shape = model_shape(target.runner)
    cfg = target.runner.model.config
    assert shape.num_layers == cfg.num_hidden_layers and shape.attention_width == cfg.num_attention_heads * (
        getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)  # fmt: skip
    r = sched.chunks.pair_cost(sched.config, sched.target)
    assert r == pair_cost(shape.attention_width, shape.num_layers, shape.layer_params) > 0
    assert sched.chunks.pair_cost(SchedulerConfig(prefill_pair_cost=0.0), sched.target) == 0.0
    assert sched.chunks.pair_cost(sched.config, object()) == 0.0  # a worker that does not tell its shape
