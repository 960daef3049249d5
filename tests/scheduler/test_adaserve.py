"""AdaServe selection and the tree baselines on hand-built trees (AdaServe §4.3, Algorithm 2, Figure 2)."""

from __future__ import annotations

import random

import pytest

from scheduler.policies.adaserve import (
    AdaServe,
    EqualGreedy,
    GlobalGreedy,
    SpecInferTree,
    TreePolicyConfig,
    best_emission,
    priced_depth,
    recoverable,
    required_tokens,
    speculation_shape,
)
from scheduler.policies.selection import (
    MarginalCost,
    SloPace,
    is_valid_subset,
    path_probs,
    select_equal_greedy,
    select_expansion,
    select_global_greedy,
    select_slo_customized,
    subtree,
    tree_depth,
    tree_width,
)
from scheduler.policies.speculation import SpecContext, SpecShape
from scheduler.report import StepReport
from scheduler.request import SLO, Request, SpecMode, SpeculationSetting
from shared.engine.types import TokenTree


def tree(nodes: list[tuple[int, float]], first_token: int = 100) -> TokenTree:
    """(parent, conditional draft probability) per node; tokens are numbered from ``first_token``."""
    return TokenTree(
        token_ids=[first_token + i for i in range(len(nodes))],
        parent_ids=[p for p, _ in nodes],
        draft_probs=[q for _, q in nodes],
    )


# Figure 2: two requests, beam search d = 3, w = 2 (t1..t6 = nodes 0..5, two per layer).
#   r0: t1 .7 ── t3 .56 ── t5 .336        r1: t1 .5 ── t3 .35 ── t5 .21
#       │    └─ t4 .07  └─ t6 .168            t2 .4 ── t4 .20 ── t6 .10
#       t2 .2
FIG2_R0 = tree([(-1, 0.7), (-1, 0.2), (0, 0.8), (0, 0.1), (2, 0.6), (2, 0.3)])
FIG2_R1 = tree([(-1, 0.5), (-1, 0.4), (0, 0.7), (1, 0.5), (2, 0.6), (3, 0.5)])
T1, T2, T3, T4, T5, T6 = range(6)


def test_path_probability_is_the_product_along_the_path():
    assert path_probs(FIG2_R0) == pytest.approx([0.7, 0.2, 0.56, 0.07, 0.336, 0.168])
    assert tree_depth(FIG2_R0) == 3 and tree_depth(TokenTree()) == 0
    assert path_probs(TokenTree(token_ids=[1, 2], parent_ids=[-1, 0])) == [1.0, 1.0]  # no probabilities: certain


def test_figure_2_worked_example():
    # Figure 2 gives A_cap(r0) = 0.6 and A_cap(r1) = 0.8 on the drafted nodes alone; Algorithm 2 counts the
    # always-emitted bonus token too (n_acc starts at 1.0), so the same requirements read A = 1.6 and 1.8.
    keep = select_slo_customized([FIG2_R0, FIG2_R1], required=[1.6, 1.8], budget=8, n_max=8)
    # SLO-customized: r1 (larger A) takes t1 (.5) then t2 (.4): 1.9 >= 1.8; r0 takes t1 (.7): 1.7 >= 1.6.
    # Throughput-optimized, remaining budget 8 - 2 roots - 3 = 3: t3(0) .56, t3(1) .35, t5(0) .336.
    assert keep == [[T1, T3, T5], [T1, T2, T3]]
    r0 = subtree(FIG2_R0, keep[0])
    assert r0.token_ids == [100, 102, 104] and r0.parent_ids == [-1, 0, 1]
    assert r0.draft_probs == pytest.approx([0.7, 0.8, 0.6])
    r1 = subtree(FIG2_R1, keep[1])
    assert r1.parent_ids == [-1, -1, 0]


def test_urgent_request_first_when_the_budget_is_short():
    # budget 4 = 2 roots + 2 nodes: r1 (A = 1.8) needs both of them; r0 gets nothing
    assert select_slo_customized([FIG2_R0, FIG2_R1], [1.6, 1.8], budget=4, n_max=8) == [[], [T1, T2]]
    # GlobalGreedy ignores the SLOs: r0's t1 and t3 are the two most probable nodes of the batch
    assert select_global_greedy([FIG2_R0, FIG2_R1], budget=4) == [[T1, T3], []]


def test_a_cap_and_n_max_bound_the_slo_step():
    # A = 10 is out of reach: A_cap = d + 1 = 4 would take the whole tree, n_max = 2 stops it at two nodes
    keep = select_slo_customized([FIG2_R0, FIG2_R1], [10.0, 0.0], budget=5, n_max=2)
    assert keep == [[T1, T3], [T1]]  # r1 only gets the last token in the throughput step
    # a request already ahead of its SLO (A <= 1) takes nothing in the SLO step
    assert select_slo_customized([FIG2_R0], [0.9], budget=2, n_max=8) == [[T1]]  # (throughput step)
    # no budget beyond the roots: nothing at all
    assert select_slo_customized([FIG2_R0, FIG2_R1], [3.0, 3.0], budget=2, n_max=8) == [[], []]
    assert select_slo_customized([FIG2_R0, FIG2_R1], [3.0, 3.0], budget=1, n_max=8) == [[], []]


def test_equal_greedy_and_expansion():
    assert select_equal_greedy([FIG2_R0, FIG2_R1], budget=8) == [[T1, T3, T5], [T1, T2, T3]]
    assert select_equal_greedy([FIG2_R0, FIG2_R1], budget=5) == [[T1], [T1]]  # floor(5/2) = 2 with the root
    # SpecInfer-style <1, 2>: the best child of the root, then its two best children
    assert select_expansion(FIG2_R0, (1, 2)) == [T1, T3, T4]
    assert select_expansion(FIG2_R0, (1, 1, 3)) == [T1, T3, T5, T6]  # the beam has two children there, not three


def random_tree(rng: random.Random) -> TokenTree:
    n = rng.randint(0, 30)
    nodes = []
    for i in range(n):
        parent = rng.randint(-1, i - 1)
        q = rng.choice([1.0, 1.0, 0.5, rng.random()])  # ties: children as likely as their parent
        nodes.append((parent, q))
    return tree(nodes)


@pytest.mark.parametrize("seed", range(5))
def test_selection_always_forms_valid_trees_within_budget(seed):
    rng = random.Random(seed)
    for _ in range(200):
        trees = [random_tree(rng) for _ in range(rng.randint(1, 6))]
        budget = rng.randint(0, 60)
        required = [rng.choice([0.0, rng.uniform(0, 8)]) for _ in trees]
        n_max = rng.randint(0, 10)
        for keep in (
            select_slo_customized(trees, required, budget, n_max),
            select_global_greedy(trees, budget),
            select_equal_greedy(trees, budget),
        ):
            assert len(keep) == len(trees)
            assert all(is_valid_subset(t, k) for t, k in zip(trees, keep))
            assert sum(map(len, keep)) <= max(0, budget - len(trees))
            for t, k in zip(trees, keep):
                sub = subtree(t, k)
                assert all(-1 <= p < i for i, p in enumerate(sub.parent_ids))
        # the budget is used up unless the candidates run out first
        keep = select_slo_customized(trees, required, budget, n_max)
        assert sum(map(len, keep)) == min(max(0, budget - len(trees)), sum(map(len, trees)))
        for t in trees:
            assert is_valid_subset(t, select_expansion(t, (1, 1, 3, 1)))


def test_subtree_rejects_orphans():
    with pytest.raises(ValueError):
        subtree(FIG2_R0, [T3])


# ----------------------------------------------------------------------------- policies


def running(rid: str, tpot_ms: float | None, generated: int, first_token_time: float = 0.0, **kw) -> Request:
    r = Request(rid, [1, 2, 3], max_new_tokens=200, slo=SLO(tpot_ms=tpot_ms), **kw)
    r.output_ids = [5] * generated
    r.first_token_time = first_token_time
    return r


def test_eq_8_9_shapes():
    assert speculation_shape(1, 32, 6, 4) == SpecShape.tree(6, 4)
    assert speculation_shape(8, 32, 6, 4) == SpecShape.tree(4, 4)  # ceil(32/8) = 4, floor = 4
    assert speculation_shape(10, 32, 6, 4) == SpecShape.tree(4, 3)  # ceil(3.2) = 4, floor(3.2) = 3
    assert speculation_shape(40, 32, 6, 4) == SpecShape.tree(1, 1)
    assert speculation_shape(0, 32, 6, 4) == SpecShape.none()


def test_required_tokens():
    # 1 s since the first token, 10 tokens after it, 100 ms SLO, next iteration 100 ms: (1 + .1) / .1 - 10 = 1
    assert required_tokens(running("a", 100.0, 11), now=1.0, t_spec=0.1) == pytest.approx(1.0)
    assert required_tokens(running("b", 100.0, 11), now=2.0, t_spec=0.1) == pytest.approx(11.0)  # behind
    assert required_tokens(running("c", None, 11), now=2.0, t_spec=0.1) == 0.0  # best effort


def test_adaserve_policy_decides_selects_and_learns_t_spec():
    policy = AdaServe(TreePolicyConfig(token_budget=8, max_depth=3, max_width=2))
    behind = running("behind", 100.0, 11)  # needs 11 tokens: takes n_max
    relaxed = running("relaxed", 1000.0, 11)
    effort = running("effort", None, 11)
    fixed = running("fixed", 100.0, 11, speculation=SpeculationSetting(SpecMode.FIXED, 2))
    batch = [relaxed, behind, effort]
    ctx = SpecContext(now=2.0, step=0, draft_available=True)
    assert policy.decide(batch, ctx) == [SpecShape.tree(3, 2)] * 3  # ceil(8/3) = 3, floor = 2
    assert policy.decide(batch, SpecContext(now=2.0, step=0, draft_available=True, token_budget=3)) == [
        SpecShape.none()
    ] * 3  # the profiled budget wins, and 3 roots spend it
    assert policy.tree_selector() is policy

    out = policy.select(batch, [FIG2_R0, FIG2_R0, FIG2_R0], ctx)
    assert [len(t) for t in out] == [0, 5, 0]  # 8 - 3 roots: the urgent one takes everything left
    # a FIXED chain keeps its nodes and is charged first: 8 - 4 roots - 2 = 2 nodes left
    chain = TokenTree.chain([7, 8], [0.9, 0.9])
    out = policy.select([relaxed, behind, effort, fixed], [FIG2_R0, FIG2_R0, FIG2_R0, chain], ctx)
    assert [len(t) for t in out] == [0, 2, 0, 2] and out[3] is chain

    report = StepReport(step=0, started_at=0.0, batch_size=3)
    report.times.total = 0.2
    policy.observe(report)
    assert policy.t_spec == pytest.approx(0.2)
    report.times.total = 0.1
    policy.observe(report)
    assert policy.t_spec == pytest.approx(0.3 * 0.1 + 0.7 * 0.2)


def test_baseline_policies():
    batch = [running("a", 100.0, 3), running("b", 100.0, 3)]
    ctx = SpecContext(now=1.0, step=0, draft_available=True, token_budget=8)
    assert [len(t) for t in GlobalGreedy().select(batch, [FIG2_R0, FIG2_R1], ctx)] == [3, 3]
    assert [len(t) for t in EqualGreedy().select(batch, [FIG2_R0, FIG2_R1], ctx)] == [3, 3]
    spec = SpecInferTree()
    assert spec.decide(batch, ctx) == [SpecShape.expanded((1, 1, 3, 1, 1, 1, 1, 1))] * 2  # drafted node by node
    assert [len(t) for t in spec.select(batch, [FIG2_R0, FIG2_R1], ctx)] == [4, 3]
    with pytest.raises(ValueError):
        SpecInferTree(())


def test_policies_by_name():
    from services.scheduler.policies import speculation_policy

    assert isinstance(speculation_policy("adaserve"), AdaServe)
    assert isinstance(speculation_policy("global_greedy"), GlobalGreedy)
    assert isinstance(speculation_policy("equal_greedy"), EqualGreedy)
    assert speculation_policy("specinfer").expansion == (1, 1, 3, 1, 1, 1, 1, 1)
    assert speculation_policy("specinfer:1-2").expansion == (1, 2)
    with pytest.raises(ValueError):
        speculation_policy("specinfer:1-0")


def test_marginal_cost_takes_a_node_only_while_it_raises_expected_goodput():
    # 2 roots (E = 2 bonus tokens), T = 30 ms, 1 ms per verify token: a node pays while f * T > 1 ms * E
    cost = MarginalCost(per_token_s=1e-3, step_s=30e-3)
    assert cost.pays(0.1, expected=2.0, num_taken=0)  # 3.0 ms > 2.0 ms
    assert not cost.pays(0.06, expected=2.0, num_taken=0)  # 1.8 ms < 2.0 ms
    # GlobalGreedy over Figure 2's trees (f: .7 .56 .5 .4 .35 .336 .2 .21 .2 .168 .1 .07): with B = 8 it fills
    # the budget; priced, it also stops where f * T < c * E (here after the 8 most probable: both stop at B)
    assert select_global_greedy([FIG2_R0, FIG2_R1], 8, cost) == select_global_greedy([FIG2_R0, FIG2_R1], 8)
    # a big budget: paper's rule takes all 12 nodes; priced, the two least probable do not pay for their ms
    free = select_global_greedy([FIG2_R0, FIG2_R1], 64)
    priced = select_global_greedy([FIG2_R0, FIG2_R1], 64, cost)
    assert sum(map(len, free)) == 12
    taken_f = sorted((path_probs(t)[n] for t, nodes in zip([FIG2_R0, FIG2_R1], priced) for n in nodes), reverse=True)
    assert taken_f == pytest.approx([0.7, 0.56, 0.5, 0.4, 0.35, 0.336, 0.21, 0.2, 0.2, 0.168])
    expected = 2 + sum(taken_f)  # the next node (f = .1) no longer pays: .1 * 40 ms < 1 ms * 5.624
    assert not cost.pays(0.1, expected, len(taken_f)) and cost.pays(0.168, expected - 0.168, 9)
    assert all(is_valid_subset(t, nodes) for t, nodes in zip([FIG2_R0, FIG2_R1], priced))
    # an expensive token: nothing but what the SLO step must take
    dear = MarginalCost(per_token_s=1.0, step_s=30e-3)
    assert select_slo_customized([FIG2_R0, FIG2_R1], [1.6, 1.8], 64, 8, dear) == [[T1], [T1, T2]]


def test_adaserve_marginal_prices_nodes_with_the_profile_and_drafts_only_as_deep_as_it_verifies():
    from shared.profiling.cost_model import CostModel

    policy = AdaServe(TreePolicyConfig(marginal_cost=True))
    batch = [running("a", None, 3), running("b", None, 3)]
    cm = CostModel(alpha_s=0.0, gamma_s=1e-3, delta_s=28e-3)
    ctx = SpecContext(now=1.0, step=0, draft_available=True, token_budget=64, cost_model=cm)
    assert policy.decide(batch, ctx) == [SpecShape.tree(6, 4)] * 2  # eq. 8-9 before any selection
    out = policy.select(batch, [FIG2_R0, FIG2_R1], ctx)
    assert sum(map(len, out)) == 10 and policy.used_depth == 3  # T = 0 ms drafting + 28 + 2 roots
    assert policy.used_width == 2 == tree_width(FIG2_R0) and tree_width(TokenTree()) == 0
    assert policy.decide(batch, ctx) == [SpecShape.tree(4, 3)] * 2  # one layer deeper, one beam wider than used
    # without a profile there is no price: the paper's rule, the whole budget, eq. 8 depth
    plain = AdaServe(TreePolicyConfig(marginal_cost=True))
    unpriced = SpecContext(now=1.0, step=0, draft_available=True, token_budget=64)
    assert sum(map(len, plain.select(batch, [FIG2_R0, FIG2_R1], unpriced))) == 12 and plain.used_depth is None
    # the drafting time observed is sunk into T: a slower step makes the same node cheaper relatively
    report = StepReport(step=0, started_at=0.0, batch_size=2)
    report.times.total, report.times.speculate = 0.05, 0.02
    policy.observe(report)
    assert policy.t_draft == pytest.approx(0.02)
    cost = policy.marginal_cost(batch, 0, ctx)
    assert cost.per_token_s == pytest.approx(1e-3) and cost.step_s == pytest.approx(0.02 + cm.predict(6, 2, True))


def test_tree_policy_options_by_name():
    from services.scheduler.policies import speculation_policy

    assert speculation_policy("adaserve:marginal").config.marginal_cost
    assert speculation_policy("global_greedy:marginal").config.marginal_cost
    assert not speculation_policy("adaserve").config.marginal_cost
    assert speculation_policy("adaserve:triage").config.triage
    both = speculation_policy("adaserve:marginal+triage").config
    assert both.marginal_cost and both.triage
    assert not speculation_policy("adaserve").config.triage
    with pytest.raises(ValueError, match="marginal"):
        speculation_policy("adaserve:cheap")
    with pytest.raises(ValueError, match="triage"):
        speculation_policy("adaserve:triage+cheap")
    assert speculation_policy("adaserve:paced+triage").config.paced
    with pytest.raises(ValueError, match="marginal"):
        speculation_policy("global_greedy:paced")  # no SLOs to pace by
    assert speculation_policy("global_greedy:marginal+depth").config.price_depth
    with pytest.raises(ValueError, match="marginal\\+depth"):
        speculation_policy("adaserve:depth")


def test_best_emission_is_the_bonus_plus_the_n_max_likeliest_nodes():
    assert best_emission(FIG2_R0, 2) == pytest.approx(1 + 0.7 + 0.56)
    assert best_emission(FIG2_R0, 0) == 1.0
    assert best_emission(FIG2_R0, 99) == pytest.approx(1 + sum(path_probs(FIG2_R0)))


def test_recoverable_asks_whether_the_best_pace_can_still_meet_the_slo():
    # 100 ms SLO, 100 ms iterations (rho = 1 token per iteration to keep pace), a_max = 2 tokens per iteration:
    # a request catches up (a_max - rho) / a_max = half a token per token it still emits
    def req(now_behind: float, remaining: int) -> tuple[Request, float]:
        r = running("r", 100.0, 11)  # 10 tokens after the first at t = 1.0 s: on pace
        r.max_new_tokens = 11 + remaining
        return r, 1.0 + now_behind * 0.1
    r, now = req(0.0, 4)
    assert recoverable(r, now, t_spec=0.1, a_max=2.0)
    r, now = req(2.0, 4)  # 2 behind, 4 left: 4 x 1/2 = 2 can be made up
    assert recoverable(r, now, t_spec=0.1, a_max=2.0)
    r, now = req(2.1, 4)
    assert not recoverable(r, now, t_spec=0.1, a_max=2.0)
    r, now = req(2.1, 40)  # the same deficit with a long way to go
    assert recoverable(r, now, t_spec=0.1, a_max=2.0)
    r, now = req(0.5, 40)
    assert not recoverable(r, now, t_spec=0.1, a_max=1.0)  # cannot outpace the iterations: any deficit is final
    assert recoverable(running("effort", None, 11), 9.0, t_spec=0.1, a_max=1.0)  # no SLO: nothing to lose
    fresh = running("fresh", 100.0, 0)
    fresh.first_token_time = None
    assert recoverable(fresh, 9.0, t_spec=0.1, a_max=1.0)  # TPOT starts at the first token


def test_triage_gives_the_slo_step_to_requests_that_can_still_make_it():
    # both stringent (100 ms), iterations of 100 ms; "lost" is 20 tokens behind with 5 left to emit, "late"
    # is 1 behind with 100 left. The paper's order serves the larger A first: the lost cause takes the budget.
    lost, late = running("lost", 100.0, 11), running("late", 100.0, 11)
    lost.max_new_tokens, late.max_new_tokens = 16, 111
    lost.first_token_time, late.first_token_time = -2.0, -0.1
    ctx = SpecContext(now=1.0, step=0, draft_available=True, token_budget=4)  # 2 roots + 2 nodes
    paper = AdaServe(TreePolicyConfig(iteration_ema=1.0))
    triage = AdaServe(TreePolicyConfig(iteration_ema=1.0, triage=True))
    for policy in (paper, triage):
        report = StepReport(step=0, started_at=0.0, batch_size=2)
        report.times.total = 0.1
        policy.observe(report)
    assert [len(t) for t in paper.select([lost, late], [FIG2_R1, FIG2_R1], ctx)] == [2, 0]
    assert [len(t) for t in triage.select([lost, late], [FIG2_R1, FIG2_R1], ctx)] == [0, 2]


def test_a_pace_protects_requests_that_meet_their_slo_this_step():
    # request 0: 100 ms SLO, on pace (base 0), step of 100 ms + 1 ms per node: A_0(N) = 1 + 0.01 N
    # request 1: no constraint
    pace = SloPace(per_token_s=0.001, step_s=0.1, base=(0.0, None), inv_tpot=(10.0, 0.0))
    assert pace.required(0, 0) == pytest.approx(1.0) and pace.required(1, 5) == 0.0
    emitted = [1.05, 1.0]  # request 0 meets A with 0.05 to spare: five more nodes of anyone's
    assert pace.allows(emitted, 4, owner=1, f=0.9)
    assert not pace.allows(emitted, 5, owner=1, f=0.9)  # the sixth would push it under
    assert pace.allows(emitted, 5, owner=0, f=0.02)  # its own node pays for its share of the step
    assert not pace.allows(emitted, 5, owner=0, f=0.005)
    assert pace.allows([0.5, 1.0], 50, owner=1, f=0.9)  # a request that misses anyway is not protected


def test_paced_selection_stops_filling_for_throughput_where_a_stringent_request_would_miss():
    stringent = tree([(-1, 0.9), (0, 0.9)])  # f = .9, .81
    relaxed = tree([(-1, 0.8), (0, 0.8), (1, 0.8), (2, 0.8)])  # f = .8, .64, .51, .41
    # the stringent request (100 ms SLO, steps of 100 ms + 1 ms a node: A grows by 0.01 a node) emits 2.71
    # with its two nodes; base 1.7: A = 1.7 + 1 + 0.01 N
    pace = SloPace(per_token_s=0.001, step_s=0.1, base=(1.7, None), inv_tpot=(10.0, 0.0))
    required = [2.7, 0.0]
    plain = select_slo_customized([stringent, relaxed], required, budget=16, n_max=8)
    assert [len(k) for k in plain] == [2, 4]
    paced = select_slo_customized([stringent, relaxed], required, budget=16, n_max=8, pace=pace)
    # with 2 nodes A = 2.72 > 2.71 already: not met, so nothing to protect; all taken as before
    assert [len(k) for k in paced] == [2, 4]
    # base 1.655: after its two nodes A = 2.675 (met, 0.035 to spare): three relaxed nodes fit, the fourth does not
    pace = SloPace(per_token_s=0.001, step_s=0.1, base=(1.655, None), inv_tpot=(10.0, 0.0))
    paced = select_slo_customized([stringent, relaxed], required, budget=16, n_max=8, pace=pace)
    assert [len(k) for k in paced] == [2, 3]


def test_adaserve_paced_keeps_the_throughput_fill_off_a_stringent_request_s_slo():
    from shared.profiling.cost_model import CostModel

    cm = CostModel(alpha_s=0.0, gamma_s=1e-3, delta_s=28e-3)  # 1 ms a verified token
    ctx = SpecContext(now=1.0, step=0, draft_available=True, token_budget=64, cost_model=cm)
    stringent = running("stringent", 100.0, 7, first_token_time=0.2275)  # l / t_TPOT - o = 7.725 - 6
    relaxed = running("relaxed", 1000.0, 3)
    batch = [stringent, relaxed]
    trees = [tree([(-1, 0.9), (0, 0.9)]), tree([(-1, 0.8), (0, 0.8), (1, 0.8), (2, 0.8)])]  # f .9 .81 / .8 ...

    def policy(**options) -> AdaServe:
        p = AdaServe(TreePolicyConfig(iteration_ema=1.0, **options))
        report = StepReport(step=0, started_at=0.0, batch_size=2)
        report.times.total = 0.1  # t_spec: 100 ms steps, 6 of their nodes verified
        p.observe(report)
        p.nodes_verified = 6.0
        return p

    paced = policy(paced=True)
    pace = paced.pace(batch, [False, False], ctx)
    assert pace.step_s == pytest.approx(0.1 - 6e-3) and pace.base == (pytest.approx(1.725), pytest.approx(-1.0))
    assert paced.pace(batch, [True, False], ctx).base[0] is None  # triaged: not protected
    paced.fixed_nodes = 2  # a FIXED-mode request's 2 nodes are verified whatever the selection takes
    assert paced.pace(batch, [False, False], ctx).step_s == pytest.approx(0.1 - 4e-3)
    paced.fixed_nodes = 0
    # the stringent request emits 2.71 with its two nodes; A(N) = 1.725 + 10 * (0.094 + 0.001 N) = 2.685 at
    # N = 2: two of the relaxed request's nodes fit, the third would push it to 2.715
    assert [len(t) for t in paced.select(batch, trees, ctx)] == [2, 2]
    assert paced.nodes_verified == pytest.approx(4.0)
    # the paper's AdaServe fills the budget whatever it does to the stringent request
    assert [len(t) for t in policy().select(batch, trees, ctx)] == [2, 4]
    # without a profile there is no price of a token: no pace
    assert paced.pace(batch, [False, False], SpecContext(now=1.0, step=0, draft_available=True)) is None


def test_a_beam_level_is_drafted_only_while_it_pays_for_its_drafting():
    # two chains of 4 with f = .8, .4, .2, .1 each: per level mass 1.6, .8, .4, .2 and 2 nodes
    chains = [tree([(-1, 0.8), (0, 0.5), (1, 0.5), (2, 0.5)])] * 2
    cost = MarginalCost(per_token_s=0.001, step_s=0.1)  # T = 0.1 + 8 nodes = 0.108 s, E = 2 + 3.0 = 5.0
    # level k pays while mass_k * 0.108 > (level_s + 0.002) * 5
    assert priced_depth(chains, cost, level_s=0.0) == 4  # drafting free: every level pays its verify
    assert priced_depth(chains, cost, level_s=0.006) == 3  # .4 * .108 = .043 > .040; .2 * .108 = .022 < .040
    assert priced_depth(chains, cost, level_s=0.02) == 1  # 1.6 * .108 = .173 > .11; .8 * .108 = .086 < .11
    assert priced_depth(chains, cost, level_s=0.05) == 0  # not even the first level: .173 < .26
    assert priced_depth([], cost, level_s=0.01) == 0


def test_marginal_with_depth_drafts_no_deeper_than_its_levels_pay():
    from shared.profiling.cost_model import CostModel

    cm = CostModel(alpha_s=0.0, gamma_s=1e-3, delta_s=28e-3)
    ctx = SpecContext(now=1.0, step=0, draft_available=True, token_budget=64, cost_model=cm)
    batch = [running("a", None, 3), running("b", None, 3)]
    chains = [tree([(-1, 0.8), (0, 0.5), (1, 0.5), (2, 0.5)])] * 2
    # T = 60 ms drafting + 30 ms roots + 8 ms nodes, E = 5.0; a level's drafting 15 ms: the second level's
    # .8 * .098 = .078 < (.015 + .002) * 5 = .085
    for price, depth in ((False, 4), (True, 1)):
        policy = AdaServe(TreePolicyConfig(marginal_cost=True, price_depth=price, iteration_ema=1.0))
        report = StepReport(step=0, started_at=0.0, batch_size=2)
        report.times.total, report.times.speculate = 0.1, 0.06  # 15 ms a level of the 4 drafted
        policy.observe(report)
        assert [len(t) for t in policy.select(batch, chains, ctx)] == [4, 4]  # the verify pricing keeps all
        assert policy.used_depth == depth
        assert policy.decide(batch, ctx)[0].depth == depth + 1  # one level deeper than priced, to keep measuring
