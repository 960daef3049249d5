"""LAPS-SD and its baselines on hand-built traces: queues, stability, eq. 6, ordering, preemption."""

from __future__ import annotations

import pytest

from scheduler.policies.acceptance_stability import Stability
from scheduler.policies.laps_sd import LapsConfig, LapsSD
from scheduler.policies.length_predictor import ClassHistoryPredictor, MaxTokensPredictor
from scheduler.policies.order_baselines import LAS, LPSJF
from scheduler.policies.preemptive import ranked_admission
from scheduler.policies.priority_queues import QueueLevels
from scheduler.policies.queue import Capacity
from scheduler.policies.remaining_time import SDCosts, remaining_time
from scheduler.request import FinishReason, Request, RequestState, SpecMode, SpeculationSetting
from shared.profiling.cost_model import CostModel

BIG = Capacity(max_batch_size=64, max_tokens_in_flight=1 << 20)


def req(rid, *, arrival=0.0, service=0.0, accepted=(), depth=4, max_new=100, generated=0, prompt=4, running=False):
    r = Request(rid, [1] * prompt, max_new_tokens=max_new)
    r.arrival_time = arrival
    r.attained_service_s = service
    r.accepted_lens = list(accepted)
    r.drafted_depths = [depth] * len(accepted)
    r.output_ids = [7] * generated
    if running:
        r.state = RequestState.RUNNING
    return r


STABLE = [2, 2, 2, 2, 2, 2]  # rate 0.5 every round: stable after γ=4 rounds


# ----------------------------------------------------------------------------- §4.2 queues


def test_thresholds_grow_geometrically():
    q = QueueLevels(num_queues=4, first_threshold=0.5, growth=2.0, unit="s")
    assert [q.threshold(j) for j in (1, 2, 3)] == [0.5, 1.0, 2.0]  # S_j = M^(j-1) S_1


def test_new_request_enters_q1_and_is_demoted_after_rounds():
    q = QueueLevels(num_queues=4, first_threshold=0.5, growth=2.0, unit="s")
    trace = [0.0, 0.3, 0.49, 0.5, 0.9, 1.0, 1.9, 2.0, 50.0]  # attained service after each round
    assert [q.level(e) for e in trace] == [1, 1, 1, 2, 2, 3, 3, 4, 4]  # Q_K is unbounded


def test_bad_queue_config():
    with pytest.raises(ValueError):
        QueueLevels(growth=1.0)
    with pytest.raises(ValueError):
        QueueLevels(unit="minutes")


def test_attained_service_is_counted_in_rounds_by_default():
    q = QueueLevels()  # S_1 = 48 rounds, whatever a round costs on this machine
    r = req("r")
    r.attained_service_s, r.attained_rounds = 100.0, 47  # a slow machine: many seconds, few rounds
    assert (q.attained(r), q.level(q.attained(r))) == (47, 1)
    r.attained_rounds = 48
    assert q.level(q.attained(r)) == 2
    seconds = QueueLevels(4, 0.5, 2.0, "s")
    assert seconds.attained(r) == 100.0 and seconds.level(seconds.attained(r)) == 4


# ----------------------------------------------------------------------------- §4.3 stability


def test_cumulative_acceptance_rates():
    r = req("a", accepted=[4, 0, 2], depth=4)
    assert r.acceptance_rates() == [1.0, 0.5, 0.5]


def test_stability_needs_gamma_rounds_within_delta():
    s = Stability(rounds=3, tolerance=0.05)
    assert s.predicted_acceptance([0.9, 0.5]) is None  # fewer than γ rounds
    assert s.predicted_acceptance([0.9, 0.5, 0.7, 0.6, 0.62]) is None  # always moving by > δ
    assert s.predicted_acceptance([0.9, 0.5, 0.6, 0.62, 0.61]) == pytest.approx((0.6 + 0.62 + 0.61) / 3)


def test_stability_is_sticky():
    s = Stability(rounds=3, tolerance=0.05)
    rates = [0.5, 0.51, 0.52]
    a = s.predicted_acceptance(rates)
    assert a is not None
    assert s.predicted_acceptance(rates + [0.9, 0.1]) == a  # later swings do not undo it


# ----------------------------------------------------------------------------- eq. 6


def test_eq6_rounds_times_round_cost():
    # L = 60, n = 4, A = 0.5 -> 3 tokens per round -> 20 rounds of (4·T_SSM + T_LLM)
    assert remaining_time(60, 0.5, 4, t_ssm=0.01, t_llm=0.1) == pytest.approx(20 * (0.04 + 0.1))
    assert remaining_time(60, 0.0, 0, t_ssm=0.01, t_llm=0.1) == pytest.approx(60 * 0.1)  # plain decoding


def test_eq6_plus_the_prefill_of_a_request_not_holding_its_kv():
    assert remaining_time(60, 0.5, 4, 0.01, 0.1, t_prefill=0.7) == pytest.approx(0.7 + 20 * (0.04 + 0.1))
    c = SDCosts(target=CostModel(alpha_s=1e-5, gamma_s=1e-3, delta_s=0.05))
    assert c.prefill_s(1000) == pytest.approx(1000 * 1e-5 + 1000 * 1e-3 + 0.05)
    assert c.prefill_s(0) == 0.0 and SDCosts().prefill_s(1000) == 0.0  # no profile: nothing to charge it in
    p = LapsSD(LapsConfig(costs=c), predictor=MaxTokensPredictor())
    waiting, running = req("w", prompt=1000), req("r", prompt=1000, running=True)
    resident = req("res", prompt=1000)
    resident.resident = True  # preempted with its KV kept: resumes without a prefill
    assert [LapsSD.tokens_to_prefill(r) for r in (waiting, running, resident)] == [1000, 0, 0]
    assert p.estimated_remaining_s(waiting, 0.5) == pytest.approx(p.estimated_remaining_s(running, 0.5) + c.prefill_s(1000))


def test_costs_from_profiled_cost_models():
    target = CostModel(alpha_s=1e-5, gamma_s=1e-3, delta_s=0.05)
    c = SDCosts(target=target)
    assert c.verify_s(context=100, depth=4) == pytest.approx(1e-3 + 5e-3 + 0.05)
    assert c.draft_token_s(context=100) == pytest.approx(0.1 * (1e-3 + 1e-3 + 0.05))  # ratio of a decode
    c = SDCosts(target=target, draft=CostModel(delta_s=0.002))
    assert c.draft_token_s(100) == pytest.approx(0.002)
    assert SDCosts().verify_s(100, 4) == 1.0  # no profile: units of one forward


def test_a_round_at_its_share_of_a_batched_forward():
    # T(b)/b: the request's own context and tokens, 1/b of the per-forward delta (and c_t on a verify)
    target = CostModel(alpha_s=1e-5, gamma_s=1e-3, delta_s=0.05, verify_s=0.01)
    c = SDCosts(target=target)
    assert c.verify_s(100, 4, batch=4) == pytest.approx(1e-3 + 5e-3 + (0.05 + 0.01) / 4)
    assert c.verify_s(100, 0, batch=4) == pytest.approx(1e-3 + 1e-3 + 0.05 / 4)  # a plain decode: no c_t
    assert c.verify_s(100, 4, batch=1) == c.verify_s(100, 4)
    assert c.draft_token_s(100, batch=4) == pytest.approx(0.1 * (1e-3 + 1e-3 + 0.05 / 4))
    assert SDCosts(target=target, draft=CostModel(gamma_s=1e-4, delta_s=0.002)).draft_token_s(100, 2) == (
        pytest.approx(1e-4 + 0.001))  # fmt: skip
    assert SDCosts().verify_s(100, 4, batch=4) == 0.25 and SDCosts().draft_token_s(100, 4) == pytest.approx(0.025)
    assert c.prefill_s(1000) == pytest.approx(1000 * 1e-5 + 1000 * 1e-3 + 0.05)  # a prefill is not shared


def test_share_weighs_a_prefill_as_what_it_costs_the_batch():
    # decode round 51 ms alone, 13.5 ms a request in a batch of 4; prefill 1 ms a token + 50 ms
    costs = SDCosts(target=CostModel(gamma_s=1e-3, delta_s=0.05), draft=CostModel(delta_s=1e-9))
    long_prompt = req("long_prompt", arrival=0.0, prompt=500, max_new=10)  # 0.55 s prefill + 10 rounds
    many_rounds = req("many_rounds", arrival=1.0, prompt=4, max_new=25)  # 0.054 s prefill + 25 rounds
    cap = Capacity(max_batch_size=4, max_tokens_in_flight=1 << 20)
    filler = [req(f"f{i}", arrival=2.0 + i, prompt=4, max_new=400) for i in range(2)]  # four requests in play

    def admitted(share: bool) -> list[str]:
        cfg = LapsConfig(levels=QueueLevels(4, 100.0, 2.0, "s"), stability=Stability(4, 0.05), unstable="estimate",
                         costs=costs, share_rounds=share)  # fmt: skip
        adm = LapsSD(cfg, predictor=MaxTokensPredictor()).schedule([long_prompt, many_rounds, *filler], [], cap, 3.0)
        return [r.id for r in adm.admit][:2]

    assert admitted(False) == ["long_prompt", "many_rounds"]  # alone: 1.06 s against 1.33 s
    assert admitted(True) == ["many_rounds", "long_prompt"]  # shared by 4: 0.39 s against 0.69 s


# ----------------------------------------------------------------------------- ordering


def laps(**kw):
    cfg = LapsConfig(levels=QueueLevels(4, 0.5, 2.0, "s"), stability=Stability(4, 0.05))
    return LapsSD(cfg, predictor=MaxTokensPredictor(), **kw)


def test_perceptible_sjf_ahead_of_fcfs_non_perceptible_within_a_queue():
    p = laps()
    np_old = req("np_old", arrival=0.0)
    np_new = req("np_new", arrival=1.0)
    p_long = req("p_long", arrival=2.0, accepted=STABLE, max_new=200)
    p_short = req("p_short", arrival=3.0, accepted=STABLE, max_new=50)
    order = p.order([np_new, p_long, np_old, p_short], now=5.0)
    assert [r.id for r in order] == ["p_short", "p_long", "np_old", "np_new"]


def test_higher_queue_first_whatever_the_state():
    p = laps()
    demoted = req("demoted", arrival=0.0, service=0.7, accepted=STABLE, max_new=10)  # Q2, perceptible, short
    fresh = req("fresh", arrival=5.0)  # Q1
    assert [r.id for r in p.order([demoted, fresh], now=6.0)] == ["fresh", "demoted"]


def test_eq6_ranks_by_acceptance_not_only_length():
    p = laps()
    # same predicted length; the one that accepts more finishes sooner
    low = req("low", accepted=[0] * 6, max_new=100)  # A = 0
    high = req("high", accepted=[4] * 6, max_new=100)  # A = 1
    assert [r.id for r in p.order([low, high], now=0.0)] == ["high", "low"]
    # LP-SJF sees only lengths: a tie, FCFS
    low.arrival_time, high.arrival_time = 0.0, 1.0
    assert [r.id for r in LPSJF(MaxTokensPredictor()).order([high, low], now=0.0)] == ["low", "high"]


def test_eq6_at_acceptance_zero_still_costs_the_speculation():
    """A speculating request that accepts nothing pays eq. 6's n draft tokens and an (n + 1)-token verify every
    round for its one emitted token; only a request that does not speculate (OFF) is costed as plain decoding."""
    p = LapsSD(LapsConfig(), predictor=MaxTokensPredictor())
    costs = p.config.costs  # no profile: a verify is one unit, a draft token 0.1 of one
    zero = req("zero", accepted=[0] * 8, depth=4, max_new=100)
    expected = remaining_time(100, 0.0, 4, costs.draft_token_s(zero.num_tokens), costs.verify_s(zero.num_tokens, 4))
    assert p.estimated_remaining_s(zero, 0.0) == pytest.approx(expected) == pytest.approx(100 * (4 * 0.1 + 1.0))
    off = req("off", max_new=100)
    off.speculation = SpeculationSetting(SpecMode.OFF)
    assert p.estimated_remaining_s(off, 0.0) == pytest.approx(100 * 1.0)  # one target forward per token
    # shortest-first serves the request that accepts a little before the one that accepts nothing
    some = req("some", accepted=[0] * 8, depth=4, max_new=100)
    assert p.estimated_remaining_s(some, 0.06) < p.estimated_remaining_s(zero, 0.0)


def estimating(predictor=None):
    cfg = LapsConfig(levels=QueueLevels(4, 0.5, 2.0, "s"), stability=Stability(4, 0.05), unstable="estimate")
    return LapsSD(cfg, predictor=predictor or MaxTokensPredictor())


def test_estimate_ranks_non_perceptible_by_eq6_still_behind_perceptible():
    p = estimating()
    long_old = req("long_old", arrival=0.0, max_new=120)
    short_new = req("short_new", arrival=1.0, max_new=10)
    perceptible = req("perceptible", arrival=2.0, accepted=STABLE, max_new=500)
    order = [r.id for r in p.order([long_old, short_new, perceptible], now=3.0)]
    assert order == ["perceptible", "short_new", "long_old"]  # the paper's default: perceptible, then FCFS
    assert [r.id for r in laps().order([long_old, short_new, perceptible], now=3.0)] == [
        "perceptible", "long_old", "short_new"]  # fmt: skip


def test_estimate_uses_acceptance_so_far_then_the_class_prior():
    p = estimating()
    # same length; one has accepted everything so far (not yet stable: 2 rounds < γ)
    keen = req("keen", arrival=1.0, accepted=[4, 4], max_new=100)
    keen.num_accepted_tokens, keen.num_drafted_tokens = 8, 8
    dull = req("dull", arrival=0.0, accepted=[0, 0], max_new=100)
    dull.num_drafted_tokens = 8
    assert [r.id for r in p.order([dull, keen], now=2.0)] == ["keen", "dull"]
    # never run: the prompt class's mean acceptance from the predictor's history
    history = ClassHistoryPredictor(smoothing=0.5, min_samples=1)
    for prompt, acc in ((4, 1.0), (300, 0.0)):
        done = finished(prompt, 100, 100)
        done.num_accepted_tokens, done.num_drafted_tokens = int(acc * 40), 40
        history.observe(done)
    p = estimating(history)
    accepting_class = req("accepting", arrival=1.0, prompt=4, max_new=100)
    rejecting_class = req("rejecting", arrival=0.0, prompt=300, max_new=100)
    assert p.acceptance_so_far(accepting_class) == 1.0 and p.acceptance_so_far(rejecting_class) == 0.0
    assert [r.id for r in p.order([rejecting_class, accepting_class], now=2.0)] == ["accepting", "rejecting"]


def test_estimate_shrinks_early_acceptance_toward_the_class_prior():
    history = ClassHistoryPredictor(smoothing=0.5, min_samples=1)
    done = finished(4, 100, 100)
    done.num_accepted_tokens, done.num_drafted_tokens = 24, 40  # the class accepts 0.6
    history.observe(done)
    p = estimating(history)  # prior_tokens = 16
    unlucky = req("unlucky", prompt=4, accepted=[0, 0], max_new=100)
    unlucky.num_drafted_tokens = 8  # two rounds of 4, nothing accepted yet
    assert p.acceptance_so_far(unlucky) == pytest.approx((0 + 16 * 0.6) / (8 + 16))  # 0.4, not 0
    veteran = req("veteran", prompt=4, max_new=100)
    veteran.num_accepted_tokens, veteran.num_drafted_tokens = 40, 400  # much evidence: its own rate wins
    assert p.acceptance_so_far(veteran) == pytest.approx((40 + 9.6) / 416)
    fresh = req("fresh", prompt=4, max_new=100)
    assert p.acceptance_so_far(fresh) == pytest.approx(0.6)  # nothing drafted: the prior
    own = LapsSD(LapsConfig(unstable="estimate", prior_tokens=0.0), predictor=history)
    assert own.acceptance_so_far(unlucky) == 0.0  # prior=0: the raw rate, as before
    with pytest.raises(ValueError):
        LapsConfig(prior_tokens=-1.0)


def test_spec_off_requests_are_perceptible_at_once():
    p = laps()
    r = req("off")
    r.speculation = SpeculationSetting(SpecMode.OFF)
    assert p.perceived_acceptance(r) == 0.0
    assert p.perceived_acceptance(req("on")) is None


def test_preempts_only_non_perceptible_running_requests():
    p = laps()
    cap = Capacity(max_batch_size=2, max_tokens_in_flight=1 << 20)
    run_np = req("run_np", arrival=0.0, service=0.6, running=True)  # Q2, non-perceptible
    run_p = req("run_p", arrival=0.0, service=3.0, accepted=STABLE, running=True)  # Q4, perceptible
    new = req("new", arrival=9.0)  # Q1
    adm = p.schedule([new], [run_np, run_p], cap, now=9.0)
    assert [r.id for r in adm.admit] == ["new"]
    assert [r.id for r in adm.preempt] == ["run_np"]  # run_p is lower-ranked but never preempted
    # nothing to displace when every running request is perceptible
    run_np.accepted_lens, run_np.drafted_depths = list(STABLE), [4] * len(STABLE)
    adm = p.schedule([new], [run_np, run_p], cap, now=9.0)
    assert adm.admit == [] and adm.preempt == []


def test_estimate_preempts_only_where_the_order_pays_for_the_switch():
    # decode 10 ms a token, prefill 1 ms a token: a 1,000-token request's re-prefill is worth 100 decode rounds
    costs = SDCosts(target=CostModel(gamma_s=1e-3, delta_s=0.009), draft=CostModel(delta_s=1e-9))
    cfg = LapsConfig(levels=QueueLevels(4, 100.0, 2.0, "s"), stability=Stability(4, 0.05), unstable="estimate", costs=costs)
    p = LapsSD(cfg, predictor=MaxTokensPredictor())
    cap = Capacity(max_batch_size=1, max_tokens_in_flight=1 << 20)
    running = req("running", arrival=0.0, prompt=1000, max_new=200, generated=50, running=True)  # 150 rounds left
    a_bit_shorter = req("a_bit_shorter", arrival=1.0, prompt=100, max_new=100)  # 0.1 s prefill + 100 rounds
    adm = p.schedule([a_bit_shorter], [running], cap, now=2.0)
    assert adm.admit == [] and adm.preempt == []  # saves 0.4 s of decode, costs a 1 s re-prefill
    much_shorter = req("much_shorter", arrival=1.0, prompt=100, max_new=10)  # 0.1 s + 10 rounds
    adm = p.schedule([much_shorter], [running], cap, now=2.0)
    assert [r.id for r in adm.admit] == ["much_shorter"] and [r.id for r in adm.preempt] == ["running"]


def test_no_preemption_without_a_better_waiting_request():
    p = laps()
    cap = Capacity(max_batch_size=2, max_tokens_in_flight=1 << 20)
    a, b = req("a", arrival=0.0, running=True), req("b", arrival=1.0, running=True)
    late = req("late", arrival=2.0)  # same queue, later: FCFS keeps a and b
    adm = p.schedule([late], [a, b], cap, now=3.0)
    assert adm.admit == [] and adm.preempt == []


def test_ranked_admission_does_not_skip_the_head_nor_preempt_for_nothing():
    cap = Capacity(max_batch_size=3, max_tokens_in_flight=300)
    head = req("head", max_new=150)  # 154 tokens: does not fit next to the pinned request
    small = req("small", max_new=10)
    pinned = req("pinned", max_new=150, running=True)
    running = req("running", max_new=50, running=True)
    rank = {"head": 0, "running": 1, "small": 2, "pinned": 3}
    adm = ranked_admission(
        [head, small], [pinned, running], cap, key=lambda r: rank[r.id], pinned=lambda r: r.id == "pinned"
    )
    # small must not overtake the head; preempting running would admit nobody, so it keeps its slot
    assert adm.admit == [] and adm.preempt == []


def test_las_quantized_attained_service_preemptive():
    las = LAS(quantum_s=0.5)
    cap = Capacity(max_batch_size=1, max_tokens_in_flight=1 << 20)
    old = req("old", arrival=0.0, service=0.4, running=True)
    new = req("new", arrival=1.0)
    assert las.schedule([new], [old], cap, now=1.0).preempt == []  # same quantum: FCFS
    old.attained_service_s = 0.6
    adm = las.schedule([new], [old], cap, now=1.0)
    assert [r.id for r in adm.admit] == ["new"] and [r.id for r in adm.preempt] == ["old"]


def test_lp_sjf_never_preempts():
    sjf = LPSJF(MaxTokensPredictor())
    cap = Capacity(max_batch_size=1, max_tokens_in_flight=1 << 20)
    long = req("long", max_new=500, running=True)
    adm = sjf.schedule([req("short", max_new=5)], [long], cap, now=0.0)
    assert adm.admit == [] and adm.preempt == []
    assert [r.id for r in sjf.order([req("b", max_new=50), req("a", max_new=5)], 0.0)] == ["a", "b"]


# ----------------------------------------------------------------------------- length prediction


def finished(prompt, max_new, generated):
    r = req("f", prompt=prompt, max_new=max_new, generated=generated)
    r.state, r.finish_reason = RequestState.FINISHED, FinishReason.STOP_TOKEN
    return r


def test_class_history_predictor():
    p = ClassHistoryPredictor(smoothing=0.5, min_samples=2)
    fresh = req("x", prompt=10, max_new=100)
    assert p.predict(fresh) == 100  # no history: the stated bound
    p.observe(finished(10, 100, 20))
    assert p.predict(fresh) == 100  # one sample is not enough
    p.observe(finished(12, 200, 80))  # same class (9..16 tokens): shares 0.2, then 0.4 -> ema 0.3
    assert p.predict(fresh) == pytest.approx(30)
    assert p.predict(req("y", prompt=100, max_new=100)) == 100  # another class
    assert p.predict(req("z", prompt=10, max_new=100, generated=50)) == 51  # never below what it produced
    aborted = finished(10, 100, 1)
    aborted.finish_reason = FinishReason.ABORTED
    p.observe(aborted)
    assert p.predict(fresh) == pytest.approx(30)  # aborted requests teach nothing
    q = ClassHistoryPredictor(smoothing=0.5, min_samples=2)
    q.load(p.state())
    assert q.predict(fresh) == pytest.approx(30)
    assert p.prior_acceptance(fresh) is None  # none of them speculated


def test_class_history_is_a_shared_state_of_events():
    p = ClassHistoryPredictor(smoothing=0.5, min_samples=1)
    done = finished(10, 100, 50)
    done.num_accepted_tokens, done.num_drafted_tokens = 3, 4
    p.observe(done)
    learned = p.shared_state()
    assert learned.name == "policy:length-predictor"
    assert learned.take() == [{"class": "p4", "share": 0.5, "acceptance": 0.75}]
    assert p.prior_acceptance(req("x", prompt=10)) == 0.75
    # a replica that merges the event learns the same
    q = ClassHistoryPredictor(smoothing=0.5, min_samples=1)
    q.load(learned.merge(None, [{"class": "p4", "share": 0.5, "acceptance": 0.75}]))
    assert q.history == p.history
    assert LapsSD(predictor=q).shared_state() is q.shared_state() and LPSJF(q).shared_state() is q.shared_state()
    assert LapsSD(predictor=MaxTokensPredictor()).shared_state() is None
