"""Frontier pipelining (FASER §4.3) over in-process engines: output equals serial SD and target-only greedy."""

from __future__ import annotations

import pytest

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.frontier import FrontierConfig, choose_chunk, pipelined_time, serial_time
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.speculation import FixedChain
from scheduler.request import Request
from shared.engine.config import EngineConfig
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.profiling.cost_model import CostModel

from test_local_workers import greedy, serve_prompts

ALWAYS = FrontierConfig(chunk_size=2, require_gain=False)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    from shared.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("models") / "tiny-draft", "llama", num_layers=1, seed=1)


def run(target_dir, draft_dir, frontier, k=5, early_exit=None, draft_worker=LocalDraftWorker, gate=None):
    config = EngineConfig(num_blocks=128, block_size=4)
    target, _ = build_target_engine(target_dir, device="cpu", engine_config=config)
    target.set_early_exit(early_exit)
    draft, _ = build_draft_engine(draft_dir, device="cpu", engine_config=config)
    sched = Scheduler(
        LocalTargetWorker(target),
        draft_worker(draft),
        spec_policy=FixedChain(k),
        config=SchedulerConfig(frontier=frontier),
    )
    if gate is not None:
        sched.frontier.gate = gate
    reqs, outs = serve_prompts(sched, (target, draft))
    return reqs, outs, sched


@pytest.mark.parametrize("agreeing", [True, False], ids=["agreeing-draft", "garbage-draft"])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_frontier_output_equals_serial_and_target_only(tiny_model_dir, draft_dir, agreeing, chunk):
    d = tiny_model_dir if agreeing else draft_dir  # the other tiny model: rejections nearly every chunk (resets)
    reqs, outs, sched = run(tiny_model_dir, d, FrontierConfig(chunk_size=chunk, require_gain=False))
    _, serial, _ = run(tiny_model_dir, d, None)
    for req, out, ser in zip(reqs, outs, serial):
        assert out == ser == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    stats = sched.frontier.stats
    assert stats.steps > 0
    if agreeing:
        assert stats.advances > 0  # the lookahead chunk was used without waiting for the draft
    else:
        assert stats.resets > 0


def test_frontier_with_early_exit(tiny_model_dir, draft_dir):
    from shared.engine.early_exit import EarlyExitConfig

    ee = EarlyExitConfig(enabled=True, init_layer=0, k_init=2, k_final=2, gate=False)
    reqs, outs, _ = run(tiny_model_dir, draft_dir, ALWAYS, early_exit=ee)
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)


def test_chunk_choice_follows_the_cost_models():
    # a draft as slow per token as the target's per-forward overhead: overlap pays off
    target = CostModel(gamma_s=1e-4, delta_s=10e-3)
    slow_draft = CostModel(delta_s=5e-3)
    fast_draft = CostModel(delta_s=1e-5)
    config = FrontierConfig()
    c = choose_chunk(6, 1, 100, target, slow_draft, config)
    assert c is not None and 1 <= c <= 6
    assert pipelined_time(c, 1, 100, target, slow_draft, 0.7) < serial_time(6, 1, 100, target, slow_draft, 0.7)
    # a nearly free draft: nothing to hide, chunks only add target forwards
    assert choose_chunk(6, 1, 100, target, fast_draft, config) is None
    # without cost models a configured chunk size is used as is
    assert choose_chunk(6, 1, 100, None, None, FrontierConfig(chunk_size=2)) == 2
    # without them and without a chunk: the measured gate's fixed chunk, or serial when that gate is off
    assert choose_chunk(6, 1, 100, None, None, FrontierConfig()) == 2
    assert choose_chunk(6, 1, 100, None, None, FrontierConfig(measured=False)) is None


def test_a_model_free_draft_is_priced_as_free_and_not_pipelined():
    """bench-faser on grounded prompts with the suffix draft: without a draft cost model the configured chunk
    was used as is, and chunking a free draft only split its chain into more verify passes (TPOT +15 %)."""
    from types import SimpleNamespace

    from services.scheduler.budget import MODEL_FREE_DRAFT, load_draft_cost_model
    from services.settings import ServiceSettings

    info = SimpleNamespace(dtype="none", model_name="suffix(max_depth=24)")
    assert load_draft_cost_model(ServiceSettings(), info) == MODEL_FREE_DRAFT
    cpu_target = CostModel(alpha_s=1.2e-5, gamma_s=0.0017, delta_s=0.0645, verify_s=0.0103)
    assert choose_chunk(4, 1, 1500, cpu_target, MODEL_FREE_DRAFT, FrontierConfig(chunk_size=2)) is None


def test_leaving_the_pipeline_rolls_back_instead_of_re_prefilling(tiny_model_dir, draft_dir):
    """The measured gate switches between pipelined and serial steps; each switch must roll the draft's optimistic
    chunk back in the next speculate call, not drop the sequence and prefill it again (for a feature draft that
    re-prefill recomputes the context's features on the target: the +42 % TPOT at 8x load, 2026-11-29)."""
    from scheduler.frontier_gate import MeasuredGate, MeasuredGateConfig

    class Counting(LocalDraftWorker):
        def __init__(self, engine):
            super().__init__(engine)
            self.prefilled, self.rollbacks = [], 0

        async def prefill(self, items):
            self.prefilled += [item.seq_id for item in items]
            return await super().prefill(items)

        async def speculate(self, items):
            self.rollbacks += sum(1 for item in items if item.rollback)
            return await super().speculate(items)

    gate = MeasuredGate(MeasuredGateConfig(min_steps=1000, run_steps=2))  # switch modes every 2 steps
    reqs, outs, sched = run(tiny_model_dir, draft_dir, ALWAYS, k=4, draft_worker=Counting, gate=gate)
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    prefilled = sched.draft.prefilled
    assert sorted(prefilled) == sorted(r.id for r in reqs)  # one prefill each: never dropped and resynced
    assert sched.draft.rollbacks > 0 and sched.frontier.stats.steps > 0


def test_a_resident_preempted_request_rolls_its_chunk_back_when_it_returns():
    """Preempted with its KV kept, a request stays on the draft with its optimistic chunk: the frontier forgets
    its state, and its next speculate call must still roll the chunk back."""
    from types import SimpleNamespace

    from scheduler.frontier import FrontierPipeline, FrontierState

    pipe = FrontierPipeline(ALWAYS)
    kept = Request(id="kept", prompt_ids=[1, 2, 3], max_new_tokens=4)
    kept.resident, kept.on_draft = True, True
    done = Request(id="done", prompt_ids=[1, 2, 3], max_new_tokens=4)
    pipe.state.update({"kept": FrontierState(optimistic=2), "done": FrontierState(optimistic=1)})
    pipe._drop_absent(SimpleNamespace(_waiting=[kept]), live=set())
    assert pipe.state == {} and kept.draft_rollback == 2 and done.draft_rollback == 0
