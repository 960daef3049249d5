"""bench.simulate: step costs reproduce their profile, runs are deterministic by seed, bad inputs fail clearly."""

from __future__ import annotations

import asyncio
import json
import random
from types import SimpleNamespace

import pytest

from bench.simulate.acceptance import (ALL, AcceptanceTrace, PositionCounts, TraceError, load_trace, chain_rate,
                                       prompt_key, replay_key, request_scale, scale_for_rate)  # fmt: skip
from bench.simulate.grid_costs import GridProfile, grid_costs, measure_grid
from bench.simulate.recorder import AcceptanceRecorder
from bench.simulate.host_time import (HostLine, HostSamples, HostTimeRecorder, HostTimes, fit_forward_excess, fit_line,
                                      with_host)  # fmt: skip
from bench.simulate.roofline import checks, roofline
from bench.simulate.runner import Phases, SimBackend, SimOptions, SimStack
from bench.simulate.shared_processor import SharedProcessor
from bench.simulate.step_costs import ConstantCosts, ProfileCosts, ProfileError, load_profile_costs
from bench.simulate.workers import SimBook, SimDraft, SimTarget
from bench.tokens import PromptEncoder
from scheduler.report import RequestOutcome, StepReport
from scheduler.spec_shape import SpecShape
from scheduler.workers import FakeClock
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem
from shared.profiling.cost_model import CostModel, Knee, Profile

CM = CostModel(alpha_s=2e-6, gamma_s=1.5e-3, delta_s=0.03, verify_s=0.004)


def _trace() -> AcceptanceTrace:
    counts = PositionCounts(reached=[100, 70, 50, 30], accepted=[70, 50, 30, 15], request_rates=[0.4, 0.6])
    return AcceptanceTrace(draft="d", target="t", kinds={ALL: counts})


def _profile(cm: CostModel = CM) -> Profile:
    knee = Knee(budget=30, method="ridge", slope_before_s=cm.gamma_s, slope_after_s=cm.gamma_s,
                latency_at_budget_s=0.07, latency_at_one_s=0.03)  # fmt: skip
    return Profile(model="m", hardware="cpu", device="cpu", dtype="float32", token_budget=30, knee=knee,
                   cost_model=cm, sweep=[(1, 0.03), (8, 0.04), (32, 0.08)])  # fmt: skip


def test_step_costs_reproduce_the_profile(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(_profile().model_dump_json())
    costs = load_profile_costs(path)

    async def go():
        clock = FakeClock()
        book = SimBook(_trace())
        book.add("a", "chat", 100, 10)
        book.add("b", "chat", 50, 10)
        target = SimTarget(book, costs, clock)
        await target.prefill([PrefillItem("a", [5] * 100), PrefillItem("b", [5] * 50)])
        assert clock.now() == pytest.approx(CM.predict(150, 150))
        t = clock.now()
        chain = TokenTree.chain([1, 1, 1], [0.7, 0.7, 0.6])
        await target.verify([VerifyItem("a", chain), VerifyItem("b", TokenTree())])
        # 101 + 51 tokens held; 1 + 3 and 1 batched; drafted tokens: a verify
        assert clock.now() - t == pytest.approx(CM.predict(101 + 51, 5, verify=True))
        t = clock.now()
        await target.verify([VerifyItem("b", TokenTree())])
        assert clock.now() - t == pytest.approx(CM.predict(target.lens["b"] - 1, 1))

    asyncio.run(go())


def test_draft_chain_costs_one_forward_per_position():
    async def go():
        clock = FakeClock()
        book = SimBook(_trace())
        book.add("a", "chat", 10, 10)
        costs = ProfileCosts("d", CostModel(gamma_s=1e-3, delta_s=0.01), call_s=0.002)
        draft = SimDraft(book, costs, clock)
        await draft.prefill([PrefillItem("a", [5] * 10)])
        t = clock.now()
        trees = await draft.speculate([SpecItem("a", new_tokens=[1, 1], chain_len=3)])
        assert len(trees[0]) == 3
        assert clock.now() - t == pytest.approx(0.002 + (0.01 + 2e-3) + 2 * (0.01 + 1e-3))

    asyncio.run(go())


def _sim(seed: int) -> dict:
    opts = SimOptions(batch1=["target-only", "tandem-k3"], sweep=["target-only", "tandem-k3", "policy:smartspec"],
                      num_prompts=2, max_new_tokens=16, sweep_requests=8, sweep_max_new_tokens=16,
                      rate_factors=[1.0, 3.0], bursty=True, seed=seed)  # fmt: skip
    stack = SimStack(ProfileCosts("t", CM, 30), ProfileCosts("d", CostModel(gamma_s=2e-4, delta_s=0.004)), _trace())
    phases = Phases(opts, SimBackend(stack, seed), PromptEncoder(None, 1000, 256), log=lambda _: None)
    asyncio.run(phases.run())
    return phases.results()


def test_same_seed_same_result():
    a, b = _sim(3), _sim(3)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    k3 = a["batch1"]["tandem-k3"]["summary"]
    assert k3["mean_accepted_length"] > 1.5  # the trace's chains accept ~1.5 of 3
    assert a["batch1"]["target-only"]["summary"]["mean_accepted_length"] == 1.0
    assert set(a["sweep"]) and set(a["bursty"])


def test_bad_profiles_fail_clearly(tmp_path):
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile_costs(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile_costs(bad)
    bad.write_text(json.dumps({"model": "m"}))
    with pytest.raises(ProfileError, match="not a `tandem profile` profile"):
        load_profile_costs(bad)
    bad.write_text(_profile(CostModel(alpha_s=-1e-3, gamma_s=1e-3, delta_s=0.01)).model_dump_json())
    with pytest.raises(ProfileError, match="negative"):
        load_profile_costs(bad)
    bad.write_text(_profile(CostModel()).model_dump_json())
    with pytest.raises(ProfileError, match="must predict > 0"):
        load_profile_costs(bad)


def test_bad_traces_fail_clearly(tmp_path):
    path = tmp_path / "t.json"
    with pytest.raises(TraceError, match="no such acceptance trace"):
        load_trace(path)
    path.write_text("[")
    with pytest.raises(TraceError, match="not JSON"):
        load_trace(path)
    good = json.loads(_trace().model_dump_json())
    for broken, msg in [
        ({**good, "kinds": {"chat": good["kinds"][ALL]}}, "needs the kind 'all'"),
        ({**good, "kinds": {ALL: {"reached": [5], "accepted": [6]}}}, "accepted 6 of reached 5"),
        ({**good, "kinds": {ALL: {"reached": [5, 4], "accepted": [3, 1]}}}, "position 0 accepted only 3"),
        ({**good, "kinds": {ALL: {"reached": [], "accepted": []}}}, "no speculation step"),
        ({**good, "version": 99}, "version 99"),
        ({**good, "kinds": {ALL: {**good["kinds"][ALL], "prompts": {"p": {"reached": [2], "accepted": [3]}}}}},
         "accepted 3 of reached 2"),
    ]:
        path.write_text(json.dumps(broken))
        with pytest.raises(TraceError, match=msg):
            load_trace(path)


def test_recorder_counts_compared_and_accepted_positions(tmp_path):
    rec = AcceptanceRecorder("d", "t")
    rec.tag("r1", "code")
    chain = SpecShape.chain(4)
    report = StepReport(step=0, started_at=0.0, outcomes=[
        RequestOutcome("r1", chain, num_drafted=4, num_accepted=2, num_emitted=3),
        RequestOutcome("r2", chain, num_drafted=4, num_accepted=4, num_emitted=5),
        RequestOutcome("r3", SpecShape.tree(2, 2), num_drafted=4, num_accepted=1, num_emitted=2),
    ])  # fmt: skip
    rec.on_step(report)
    trace = rec.trace()
    assert trace.kinds["code"].reached == [1, 1, 1] and trace.kinds["code"].accepted == [1, 1, 0]
    assert trace.kinds[ALL].reached == [2, 2, 2, 1] and trace.kinds[ALL].accepted == [2, 2, 1, 1]
    assert rec.num_tree_steps == 1
    assert load_trace(trace.save(tmp_path / "x.json")).counts("chat").reached == [2, 2, 2, 1]  # unknown kind: all


def test_roofline_matches_published_step_times():
    for check in checks():
        assert 0.75 <= check.ratio <= 1.35, check
    h100 = roofline("h100", "llama-3-8b")
    assert h100.forward_s(64, 512, 64 * 512) > 1.5 * h100.forward_s(1, 1, 512)  # compute-bound past the ridge
    with pytest.raises(ValueError, match="unknown GPU"):
        roofline("tpu", "llama-3-8b")
    assert ConstantCosts("ngram", 0.001).forward_s(4, 100, 1000) == 0.0


def test_a_recorded_prompt_keeps_its_own_acceptance(tmp_path):
    """Greedy acceptance is the prompt's: a prompt the trace saw is replayed with its own p_i, not a drawn rate."""
    rec = AcceptanceRecorder("d", "t")
    easy, hard = prompt_key([1, 2, 3]), prompt_key([4, 5, 6])
    chain = SpecShape.chain(4)
    for rid, prompt, accepted in (("r1", easy, 4), ("r2", hard, 0), ("r3", None, 1)):
        rec.tag(rid, "chat", prompt)
        rec.on_step(StepReport(step=0, started_at=0.0, outcomes=[
            RequestOutcome(rid, chain, num_drafted=4, num_accepted=accepted, num_emitted=accepted + 1)]))  # fmt: skip
        rec.on_finish(SimpleNamespace(id=rid, num_drafted_tokens=4, num_accepted_tokens=accepted))
    trace = load_trace(rec.trace().save(tmp_path / "t.json"))
    assert trace.prompt(easy).rates() == [1.0, 1.0, 1.0, 1.0] and trace.prompt(hard).rates() == [0.0]
    assert trace.prompt(prompt_key([9])) is None and trace.kinds["chat"].typical_k == 4
    book = SimBook(trace)
    book.add("a", "chat", 3, 10, easy)
    book.add("b", "chat", 3, 10, hard)
    assert book.requests["a"].sampler.probs(4) == [1.0] * 4 and book.requests["b"].sampler.p(0) == 0.0
    drawn = {request_scale(trace, "chat", random.Random(s)) for s in range(20)}
    assert trace.prompt(replay_key([1, 2, 3], 48)).rates() == [1.0] * 4  # a trace keyed by prompt alone serves spans
    assert len(drawn) > 1  # an unseen prompt draws its rate from the recorded requests


def test_a_drawn_rate_is_what_the_scaled_chain_accepts():
    p = [0.5, 0.6, 0.4, 0.3]
    for rate in (0.05, 0.2, 0.5, 0.9):
        assert chain_rate(p, 3, scale_for_rate(p, 3, rate)) == pytest.approx(rate, abs=1e-6)
    assert chain_rate(p, 3, scale_for_rate(p, 3, 1.0)) == 1.0 and scale_for_rate([0.0], 3, 0.5) == 1.0


def _grid() -> GridProfile:
    # T = 10 ms + 2 ms per sequence + 1 ms per drafted token per sequence; prefill 0.5 ms per token
    seqs, depths = [1, 2, 4], [1, 2, 4]
    seconds = [[0.010 + 0.002 * s + 0.001 * s * (d - 1) for d in depths] for s in seqs]
    return GridProfile(model="m", seqs=seqs, depths=depths, seconds=seconds, alpha_s=1e-5, prefill_tokens=[16, 64],
                       prefill_seconds=[0.008, 0.032], short_context=64)  # fmt: skip


def test_grid_costs_reproduce_the_grid_and_interpolate():
    costs = grid_costs(_grid())
    for s in (1, 2, 4):
        for d in (1, 2, 4):
            assert costs.forward_s(s, s * d, s * 64) == pytest.approx(0.010 + 0.002 * s + 0.001 * s * (d - 1))
    assert costs.forward_s(1, 3, 64) == pytest.approx(0.014)  # between depths 2 and 4
    assert costs.forward_s(3, 3, 3 * 64) == pytest.approx(0.016)  # between 2 and 4 sequences
    assert costs.forward_s(8, 8, 8 * 64) == pytest.approx(0.026)  # beyond the grid: the last slope
    assert costs.forward_s(1, 1, 64 + 1000) == pytest.approx(0.012 + 0.01)  # context beyond the grid's: alpha
    assert costs.forward_s(1, 40, 40) == pytest.approx(0.020)  # a prompt, not a chain: the prefill curve
    bad = _grid().model_copy(update={"seconds": [[0.01, 0.02]]})
    with pytest.raises(ValueError, match="not 3 x 3"):
        grid_costs(bad)
    with pytest.raises(ValueError, match="> 0 s"):
        grid_costs(_grid().model_copy(update={"prefill_seconds": [0.0, 0.01]}))


def test_grid_is_measured_on_a_real_runner_and_leaves_it_clean(tmp_path, tiny_model_dir):
    from shared.engine.factory import build_target_engine

    engine, loaded = build_target_engine(tiny_model_dir, device="cpu", dtype="float32", with_tokenizer=False)
    free = engine.runner.cache.num_free_blocks
    grid = measure_grid(engine.runner, loaded.name, seqs=(1, 2), depths=(1, 3), prefill_tokens=(8, 32), repeats=1)
    assert engine.runner.cache.num_free_blocks == free
    assert len(grid.seconds) == 2 and all(len(r) == 2 and min(r) > 0 for r in grid.seconds)
    again = grid_costs(GridProfile.model_validate_json(grid.save(tmp_path / "g.json").read_text()))
    assert again.forward_s(2, 6, 128) == pytest.approx(grid.seconds[1][1])


def test_fidelity_smoke_on_the_tiny_pair(tmp_path):
    """Real and simulated halves, grids, trace with prompt keys, cells and README, on the tiny pair."""
    from bench.simulate.fidelity import fidelity_options, run_fidelity
    from bench.stack import Models
    from tests.support.tiny_stack import save_tiny_pair

    target, draft = save_tiny_pair(tmp_path / "models")
    opts = fidelity_options(num_prompts=1, max_new_tokens=6, sweep_requests=3, sweep_max_new_tokens=6,
                            rate_factors=[1.0], bursty=False)  # fmt: skip
    out = run_fidelity(tmp_path / "fid", opts, quick_profile=True, models=Models(target=target, draft=draft),
                       log=lambda _: None, seeds=2)  # fmt: skip
    metrics = {(c["phase"], c["config"], c["metric"]) for c in out["cells"]}
    assert ("batch1", "tandem-k3", "tpot_s") in metrics and ("sweep", "policy:smartspec", "latency_s") in metrics
    trace = load_trace(tmp_path / "fid" / "trace-demo.json")
    assert any(c.prompts for c in trace.kinds.values())  # the real half tagged its prompts
    grid = GridProfile.model_validate_json((tmp_path / "fid" / "grid-target.json").read_text())
    assert grid_costs(grid).forward_s(1, 1, 64) > 0
    assert "cells within 10 %" in (tmp_path / "fid" / "README.md").read_text()
    # the host time the grids miss was measured on the real half: calls of both engines and the scheduler's steps
    host = HostTimes.model_validate_json((tmp_path / "fid" / "host-times.json").read_text())
    assert host.target.samples > 0 and host.draft.samples > 0 and host.scheduler.samples > 0
    assert len(out["cells_forwards_only"]) == len(out["cells"])
    assert out["simulation_seeds"] == [0, 1] and all(len(c["error_range"]) == 2 for c in out["cells"] if c["real"])
    assert host.target_forward.samples > 0 and host.draft_forward.samples > 0  # each forward against its grid charge
    assert "overlapping calls share the CPU" in (tmp_path / "fid" / "README.md").read_text()


def test_host_line_fit_and_charge():
    line = fit_line([(1, 0.003), (2, 0.005), (4, 0.009), (8, 0.017)])  # 1 ms + 2 ms per sequence
    assert line.base_s == pytest.approx(0.001) and line.per_seq_s == pytest.approx(0.002) and line.samples == 4
    assert fit_line([(3, 0.002), (3, 0.004), (3, 0.003)]) == HostLine(base_s=0.003, samples=3)  # no spread in rows
    assert fit_line([(1, 0.01), (8, 0.001)]).per_seq_s == 0.0  # never a negative slope
    assert fit_line([]) == HostLine()
    inner = ConstantCosts("const", call_s=0.5)
    costs = with_host(inner, HostLine(base_s=0.01, per_seq_s=0.002), HostLine(base_s=0.001, per_seq_s=0.001))
    assert costs.call_s == pytest.approx(0.511) and costs.forward_s(4, 8, 100) == pytest.approx(0.012)
    assert with_host(inner, HostLine()) is inner


def test_host_time_recorder_takes_the_schedulers_own_time():
    from scheduler.report import PhaseTimes, StepReport

    samples = HostSamples()
    rec = HostTimeRecorder(samples)
    rec.on_step(StepReport(1, 0.0, PhaseTimes(select=0.001, verify=0.05, commit=0.002, overhead=0.003), batch_size=3))
    rec.on_step(StepReport(2, 0.0, PhaseTimes(prefill=0.1), batch_size=0))  # prefill only: nothing verified
    assert samples.scheduler == [(3, pytest.approx(0.006))]


class _Flat:
    """Every forward costs ``forward`` seconds (a stand-in grid)."""

    name, call_s = "flat", 0.0

    def __init__(self, forward: float) -> None:
        self.forward = forward

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        return self.forward


def test_forward_excess_is_fitted_per_sequence_over_the_grid_charge():
    inner = _Flat(0.010)
    # decode / verify forwards costing the grid's 10 ms plus 0.5 ms per sequence; a prefill (N/S > 8) far off
    forwards = [(s, 2 * s, 100 * s, 0.010 + 0.0005 * s) for s in (1, 2, 4, 8)] + [(1, 300, 300, 0.5)]
    line = fit_forward_excess(forwards, inner)
    assert line.per_seq_s == pytest.approx(0.0005) and line.base_s == pytest.approx(0.0) and line.samples == 4
    # an intercept that would come out negative: the line through the origin instead, never below zero
    assert fit_forward_excess([(1, 1, 64, 0.0099), (8, 8, 512, 0.018)], inner).base_s == 0.0
    assert fit_forward_excess([(1, 1, 64, 0.0099), (8, 8, 512, 0.018)], inner).per_seq_s > 0
    assert fit_forward_excess([(4, 4, 64, 0.005)], inner) == HostLine(samples=1)  # faster than the grid: no excess
    assert fit_forward_excess([], inner) == HostLine()
    costs = with_host(inner, forward=HostLine(per_seq_s=0.001))  # charged on every forward, not per call
    assert costs.call_s == 0.0 and costs.forward_s(4, 8, 100) == pytest.approx(0.014)


def test_shared_processor_splits_the_cores_between_overlapping_calls():
    async def go():
        clock = FakeClock()
        cpu = SharedProcessor(clock)
        done = {}

        async def job(name, seconds, start=0.0):
            await clock.sleep(start)
            await cpu.run(seconds)
            done[name] = clock.now()

        await job("alone", 1.0)
        t0 = clock.now()
        await asyncio.gather(job("short", 1.0), job("long", 2.0))  # both at rate 1/2 until short is done
        await asyncio.gather(job("a", 2.0), job("b", 0.5, start=1.0))  # b arrives half way through a's work
        return t0, done, cpu

    t0, done, cpu = asyncio.run(go())
    assert done["alone"] == pytest.approx(1.0)
    assert done["short"] - t0 == pytest.approx(2.0) and done["long"] - t0 == pytest.approx(3.0)  # work conserved
    start = t0 + 3.0
    assert done["b"] - start == pytest.approx(2.0) and done["a"] - start == pytest.approx(2.5)
    assert cpu.running == 0 and cpu.busy_s == pytest.approx(6.5)


def test_a_cancelled_call_stops_taking_its_share():
    async def go():
        clock = FakeClock()
        cpu = SharedProcessor(clock)
        ghost = asyncio.ensure_future(cpu.run(10.0))
        await clock.sleep(1.0)  # 1 s alone: 9 s of its work left
        ghost.cancel()
        await asyncio.gather(ghost, return_exceptions=True)
        t0 = clock.now()
        await cpu.run(1.0)
        return clock.now() - t0, cpu.running

    took, running = asyncio.run(go())
    assert took == pytest.approx(1.0) and running == 0


def test_simulated_prefills_overlap_for_free_on_devices_and_share_one_cpu():
    costs = _Flat(0.1)

    async def prefill_both(shared: bool) -> float:
        clock = FakeClock()
        cpu = SharedProcessor(clock) if shared else None
        book = SimBook(None)
        target, draft = SimTarget(book, costs, clock, processor=cpu), SimDraft(book, costs, clock, processor=cpu)
        items = [PrefillItem("r", [1, 2, 3])]
        await asyncio.gather(target.prefill(items), draft.prefill(items))
        return clock.now()

    assert asyncio.run(prefill_both(False)) == pytest.approx(0.1)
    assert asyncio.run(prefill_both(True)) == pytest.approx(0.2)


def test_a_prompt_replays_the_span_its_budget_generated():
    """The same prompt asked for 48 tokens and for 32: each span its own acceptance, others get them merged."""
    rec = AcceptanceRecorder("d", "t")
    long_, short = replay_key([1, 2, 3], 48), replay_key([1, 2, 3], 32)
    assert long_.startswith(prompt_key([1, 2, 3])) and long_ != short and replay_key([1, 2, 3]) == prompt_key([1, 2, 3])
    for rid, key, accepted in (("a", long_, 2), ("b", short, 0)):
        rec.tag(rid, "chat", key)
        rec.on_step(StepReport(step=0, started_at=0.0, outcomes=[
            RequestOutcome(rid, SpecShape.chain(2), num_drafted=2, num_accepted=accepted, num_emitted=accepted + 1)]))  # fmt: skip
    trace = rec.trace()
    assert trace.prompt(long_).rates() == [1.0, 1.0] and trace.prompt(short).rates() == [0.0]
    assert trace.prompt(replay_key([1, 2, 3], 64)).rates() == [0.5, 1.0]  # unseen budget: both spans merged
    assert trace.prompt(prompt_key([1, 2, 3])).num_steps == 2 and trace.prompt(replay_key([9], 48)) is None


def test_fidelity_averages_the_simulations_over_seeds():
    from bench.simulate.fidelity import compare, seed_mean

    def results(latency: float) -> dict:
        summary = {"latency_s": {"mean": latency}, "tpot_s": {"mean": latency / 10}, "throughput_tok_s": 10.0}
        return {"batch1": {"k3": {"summary": dict(summary)}}, "sweep": {"rate=1": {"k3": {"summary": dict(summary)}}}}

    sim = seed_mean([results(1.0), results(2.0), results(3.0)])
    assert sim["sweep"]["rate=1"]["k3"]["summary"]["latency_s"]["mean"] == pytest.approx(2.0)
    assert sim["batch1"]["k3"]["summary"]["seed_values"]["latency_s"] == [1.0, 2.0, 3.0]
    cells = {(c["phase"], c["metric"]): c for c in compare(results(2.0), sim)}
    assert cells[("sweep", "latency_s")]["error"] == pytest.approx(0.0)
    assert cells[("sweep", "latency_s")]["error_range"] == pytest.approx([-0.5, 0.5])
