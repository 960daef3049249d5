"""Token-wise early exit (FASER §4.2): pruning never changes the output, pruned nodes are rejected, KV holds."""

import random

import pytest
import torch

from shared.engine.acceptance import REJECTED, accept_tree
from shared.engine.draft_engine import DraftEngine
from shared.engine.early_exit import (
    PRUNE,
    SHADOW,
    SKIP,
    EarlyExitConfig,
    EarlyExitController,
    PruneOutcome,
    check_layers,
    k_at,
    layer_outcomes,
    prune_outcome,
    time_saved,
)
from shared.engine.runner import Work
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SparseDist, SpecItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny

from conftest import Reference, make_runner
from test_lossless_greedy import NUM_TOKENS, SHAPES, prompts_for

# prune hard: every check layer from layer 1, a drafted token must be in the top 3 of its parent's logits
AGGRESSIVE = EarlyExitConfig(enabled=True, init_layer=1, k_init=3, k_final=3, gate=False)


@pytest.fixture(scope="module")
def deep_target():
    return build_tiny("llama", vocab_size=96, seed=0, num_layers=6)


@pytest.fixture(scope="module")
def deep_reference(deep_target):
    return Reference(deep_target)


def run_sd(target, draft, prompts, shape_of):
    outs = {k: [] for k in prompts}
    new = {}
    for r in target.prefill([PrefillItem(k, v) for k, v in prompts.items()]):
        outs[r.seq_id].append(r.first_token)
        new[r.seq_id] = [r.first_token]
    draft.prefill([PrefillItem(k, v) for k, v in prompts.items()])
    drafted = pruned = 0
    while live := [k for k in prompts if len(outs[k]) < NUM_TOKENS]:
        trees = draft.speculate([shape_of(i, k, new[k]) for i, k in enumerate(live)])
        step = target.step([], [VerifyItem(k, t) for k, t in zip(live, trees)])
        for k, tree, res in zip(live, trees, step.verifies):
            outs[k] += res.tokens
            new[k] = res.tokens
            drafted += len(tree)
            pruned += res.num_pruned
            assert all(res.node_status[j] == REJECTED for j in res.pruned_nodes)
            target.runner.check_accounting()
    return {k: v[:NUM_TOKENS] for k, v in outs.items()}, drafted, pruned


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("self_draft", [False, True])
def test_early_exit_never_changes_greedy_output(deep_target, deep_reference, batch, shape, self_draft):
    """Random drafts (a different model) and good drafts (the target's own weights) under aggressive pruning."""
    prompts = prompts_for(batch, seed=10 + batch)
    target = TargetEngine(make_runner(deep_target), early_exit=AGGRESSIVE)
    draft_model = (
        build_tiny("llama", vocab_size=96, seed=0, num_layers=6)
        if self_draft
        else build_tiny("llama", vocab_size=96, seed=1, hidden_size=32, num_layers=1)
    )
    draft = DraftEngine(make_runner(draft_model))
    outs, drafted, pruned = run_sd(target, draft, prompts, SHAPES[shape])
    for k, prompt in prompts.items():
        assert outs[k] == deep_reference.greedy(prompt, NUM_TOKENS), k
    if drafted and not self_draft:
        assert pruned > 0  # the random draft is mostly outside the top 3
    target.release(list(prompts))
    draft.release(list(prompts))
    target.runner.check_accounting()
    assert target.runner.cache.num_free_blocks == target.runner.cache.num_blocks


def test_random_trees_batched_lossless(deep_target, deep_reference):
    """Hand-made random trees, where the target's greedy token sometimes sits in a pruned branch."""
    rng = random.Random(3)
    prompts = prompts_for(3, seed=5)
    target = TargetEngine(make_runner(deep_target), early_exit=AGGRESSIVE)
    want = {k: deep_reference.greedy(p, NUM_TOKENS) for k, p in prompts.items()}
    outs = {k: [r.first_token] for k, r in zip(prompts, target.prefill([PrefillItem(k, v) for k, v in prompts.items()]))}
    total_pruned = 0
    while live := [k for k in prompts if len(outs[k]) < NUM_TOKENS]:
        items = []
        for k in live:
            truth = want[k][len(outs[k]) : len(outs[k]) + 6]  # the right continuation, to plant in the tree
            tokens, parents = [], []
            for j in range(rng.randint(0, 10)):
                parent = rng.randrange(-1, j) if j else -1
                depth = 0
                p = parent
                while p >= 0:
                    depth, p = depth + 1, parents[p]
                good = rng.random() < 0.6 and depth < len(truth)
                tokens.append(truth[depth] if good else rng.randrange(96))
                parents.append(parent)
            items.append(VerifyItem(k, TokenTree(tokens, parents)))
        for k, item, res in zip(live, items, target.verify(items)):
            assert res.tokens == want[k][len(outs[k]) : len(outs[k]) + len(res.tokens)]
            outs[k] += res.tokens
            total_pruned += res.num_pruned
            assert all(res.node_status[j] == REJECTED for j in res.pruned_nodes)
            assert not set(res.accepted_nodes) & set(res.pruned_nodes)
        target.runner.check_accounting()
    assert total_pruned > 0
    target.release(list(prompts))
    target.runner.check_accounting()


def test_no_prune_path_equals_plain_forward(deep_target):
    """The layer-by-layer path with nothing pruned gives the plain forward's logits."""
    tree = TokenTree([5, 7, 9, 11], [-1, 0, 0, 1])
    outs = []
    for config in (None, EarlyExitConfig(enabled=True, init_layer=1, k_init=96, k_final=96, gate=False)):
        target = TargetEngine(make_runner(deep_target), early_exit=config)
        target.prefill([PrefillItem("a", [1, 2, 3, 4, 5])])
        seq = target.runner.get("a")
        ee = target.early_exit
        if ee is not None:
            ee.begin(["a"], [len(tree)])
        out = target.runner.forward(
            [Work(seq, new_nodes=list(zip(tree.token_ids, tree.parent_ids)), want_root=True, want_nodes=True)],
            early_exit=ee,
        )
        assert out.pruned == [[]]
        outs.append(out.logits)
        if ee is not None:
            assert ee.num_checks > 0
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)


def test_pruned_rows_skip_layers_and_subtrees(deep_target):
    """A node outside the top-K goes with its whole subtree; its KV is never reused by commit."""
    target = TargetEngine(make_runner(deep_target), early_exit=EarlyExitConfig(enabled=True, init_layer=1, k_init=1, k_final=1, gate=False))
    target.prefill([PrefillItem("a", [1, 2, 3, 4, 5])])
    seq = target.runner.get("a")
    tree = TokenTree([5, 7, 9, 11, 13], [-1, 0, 0, 1, 3])
    target.early_exit.begin(["a"], [len(tree)])
    out = target.runner.forward(
        [Work(seq, new_nodes=list(zip(tree.token_ids, tree.parent_ids)), want_root=True, want_nodes=True)],
        early_exit=target.early_exit,
    )
    pruned = set(out.pruned[0])
    for node, parent in enumerate(tree.parent_ids):
        if parent in pruned:
            assert node in pruned  # a pruned node takes its subtree with it
    assert seq.tree.pruned == pruned
    # committing a pruned node's token does not reuse its (incomplete) KV
    if 0 in pruned:
        reused = target.runner.commit(seq, [5])
        assert reused == 0
    else:
        target.runner.commit(seq, [])
    target.release(["a"])
    target.runner.check_accounting()


def test_pruned_node_accepted_by_the_test_becomes_the_bonus():
    """Greedy: a pruned child equal to the argmax ends the walk with that token as bonus, reported rejected."""
    logits = torch.full((4, 6), -5.0)
    logits[0, 2] = 5.0  # root wants token 2
    logits[1, 3] = 5.0
    tree = TokenTree([2, 3, 4], [-1, 0, -1])
    full = accept_tree(tree, logits, SamplingParams())
    assert full.tokens[:2] == [2, 3]
    cut = accept_tree(tree, logits, SamplingParams(), pruned=[0, 1])
    assert cut.tokens == [2] and cut.accepted_nodes == [] and cut.num_pruned == 2
    assert cut.node_status[0] == REJECTED and cut.node_status[1] == REJECTED


def test_sampling_with_pruning_keeps_the_target_distribution():
    """Multi-round rejection sampling with pruned children still emits the first token ~ p (chi-square)."""
    vocab = 5
    p_logits = torch.tensor([1.0, 0.2, -0.5, 0.7, 0.0])
    p = torch.softmax(p_logits, -1)
    q = SparseDist(torch.arange(vocab), torch.tensor([0.1, 0.5, 0.2, 0.1, 0.1]))
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab)
    n = 6000
    params = SamplingParams(temperature=1.0)
    for _ in range(n):
        kids = torch.multinomial(q.probs, 2, replacement=True, generator=gen).tolist()
        tree = TokenTree(kids, [-1, -1])
        tree.child_dists = {0: q}
        logits = torch.stack([p_logits, p_logits, p_logits])  # rows of pruned nodes are garbage anyway
        res = accept_tree(tree, logits, params, gen, pruned=[0])  # the first candidate is always pruned
        counts[res.tokens[0]] += 1
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # 4 degrees of freedom, p = 0.001


def test_gate_follows_eq_10():
    config = EarlyExitConfig(enabled=True, init_layer=0.5, k_init=20, k_final=4)
    assert check_layers(config, 8) == [4, 5, 6]
    assert k_at(config, 4, 8) == 20 and k_at(config, 7, 8) == 4
    ctrl = EarlyExitController(config, 8)
    ctrl.stats.t_token_layer = 1e-4
    ctrl.stats.t_prune = 1e-3
    ctrl.observe_check(2e-4, 2)  # 1e-4 s a parent row
    ctrl.begin(["a", "b"], [8, 8])  # prior acceptance 0.5: k_rej = 8
    ctrl.begin_forward(20)
    # saving at layer 4: (8 - 5 - dL) / 8 * 8 tokens * 8 layers * 1e-4 ~ 2.2e-3 > 1e-3 + 2e-4
    assert time_saved(4, 8, 1e-4, 20, 8.0, 2e-4) > 1.2e-3
    assert ctrl.should_check(4, 2)
    assert not ctrl.should_check(6, 2)  # one layer left: 0.8e-3 minus checker time < prune cost
    assert not ctrl.should_check(3, 2)  # before L_init
    for _ in range(30):
        ctrl.observe_accept("a", 8, 8)
        ctrl.observe_accept("b", 8, 8)
    ctrl.begin(["a", "b"], [8, 8])  # everything gets accepted: nothing to save
    assert not ctrl.should_check(4, 2)


def _gate_at_batch_1(config: EarlyExitConfig) -> EarlyExitController:
    """A batch-1 verify of a 5-node tree on an 8-layer target, costs as measured there."""
    ctrl = EarlyExitController(config, 8)
    ctrl.stats.t_prune = 1e-4
    ctrl.observe_check(1e-5, 1)
    ctrl.begin(["a"], [5])  # prior acceptance 0.5: k_rej = 2.5
    ctrl.begin_forward(6)
    return ctrl


def test_a_check_of_an_unseen_size_is_measured_not_extrapolated_per_row():
    """Checks timed at batch 1 (4 parent rows, 3.4 ms: the LM-head read, memory-bound) priced per row would put a
    64-row check at 54 ms and keep the gate shut under load for good (2026-11-29, 0 pruned at 2.9 req/s). A size
    beyond what was timed is checked once; then the line through both sizes prices it (FASER eq. 13: linear)."""
    ctrl = EarlyExitController(EarlyExitConfig(enabled=True, init_layer=0.5, token_cost_s=4e-3), 8)  # 0.5 ms a layer
    ctrl.stats.t_prune = 1e-3
    for _ in range(10):
        ctrl.observe_check(3.4e-3, 4)
    ctrl.observe_forward(40e-3, 5 * 8)
    ctrl.begin(["a"], [4])  # batch 1: k_rej = 2 rows x < 3 layers left x 0.5 ms < 3 ms saved ...
    ctrl.begin_forward(5)
    assert not ctrl.should_check(4, 4)  # ... against 1 ms of prune + 3.4 ms of check: shut
    ctrl.begin([str(i) for i in range(16)], [4] * 16)  # 16 requests: k_rej = 32
    ctrl.begin_forward(80)
    assert ctrl.should_check(4, 64)  # never timed near 64 rows: measure
    ctrl.observe_check(6e-3, 64)  # compute-bound: 6 ms, not 54
    assert 5e-3 < ctrl.stats.check_line.predict(64) < 7e-3
    assert 3.4e-3 / 4 * 64 > 32 * 3 * 0.5e-3  # per-row pricing (54 ms) would outweigh the ~48 ms saved ...
    assert ctrl.should_check(4, 64)  # ... the line's 6 ms does not


def test_a_flat_forward_cost_closes_the_gate():
    """eq. 9 prices a pruned row at the marginal cost: on a host-bound GPU (T(n) flat) pruning saves nothing,
    even though a forward's time over its rows says each row costs a lot (the 2026-11-28 H200 run)."""
    config = EarlyExitConfig(enabled=True, init_layer=0.5)
    fitted = _gate_at_batch_1(config)
    for n in (2, 6, 10, 4, 8, 3, 9):  # verify sizes vary (FASER's lengths); 25 ms a forward whatever the size
        fitted.observe_forward(25e-3, n * 8)
    slope, source = fitted.marginal_token_layer()
    assert source == "fitted" and slope < 1e-12
    for _ in range(40):  # the gate closed, so no more pruning: every forward now the same size
        fitted.observe_forward(25e-3, 6 * 8)
    assert fitted.marginal_token_layer()[1] == "fitted" and not fitted.should_check(4, 1)  # the slope is kept
    assert fitted.stats.t_token_layer > 3e-4  # the average: what the gate used before
    assert not fitted.should_check(4, 1)
    profiled = _gate_at_batch_1(config.model_copy(update={"token_cost_s": 1e-6}))  # the profile's gamma
    profiled.observe_forward(25e-3, 6 * 8)
    assert profiled.marginal_token_layer() == (1e-6 / 8, "profile")
    assert not profiled.should_check(4, 1)


def test_a_per_token_forward_cost_keeps_the_gate_open():
    """Where every row costs compute (T = 2 ms + 1 ms per row), pruning likely-rejected rows pays."""
    ctrl = _gate_at_batch_1(EarlyExitConfig(enabled=True, init_layer=0.5))
    for n in (2, 6, 10, 4, 8, 3, 9):
        ctrl.observe_forward(2e-3 + n * 1e-3, n * 8)
    slope, source = ctrl.marginal_token_layer()
    assert source == "fitted" and abs(slope - 1e-3 / 8) < 1e-9
    assert ctrl.should_check(4, 1)


def test_forwards_of_one_size_fall_back_to_the_average():
    """With every forward the same size the slope cannot be told from the fixed cost: the average stays."""
    ctrl = _gate_at_batch_1(EarlyExitConfig(enabled=True, init_layer=0.5))
    for _ in range(5):
        ctrl.observe_forward(12e-3, 6 * 8)
    slope, source = ctrl.marginal_token_layer()
    assert source == "average" and abs(slope - 12e-3 / 48) < 1e-12


def test_prune_outcome_counts_reached_and_passed_nodes():
    #        root
    #      n0    n1(pruned)       n0 accepted; n2 (under n0) pruned and equal to the bonus: it passed
    #     n2(p) n3
    parents, tokens = [-1, -1, 0, 0], [10, 11, 12, 13]
    out = prune_outcome(parents, tokens, accepted_nodes=[0], bonus=12, pruned=[1, 2])
    assert (out.pruned_reached, out.pruned_passed, out.kept_reached, out.kept_passed) == (2, 1, 2, 1)
    out = prune_outcome(parents, tokens, accepted_nodes=[], bonus=11, pruned=[1, 2])  # n1 passed at the root
    assert (out.pruned_reached, out.pruned_passed, out.kept_reached, out.kept_passed) == (1, 1, 1, 0)


def test_pruning_without_an_exit_signal_closes_the_gate():
    """Pruned nodes pass as often as kept ones (SmolLM2's middle layers): the gate closes but for exploration;
    a wrong prune counts as accepted in a_i, so it does not feed k_rej."""
    config = EarlyExitConfig(enabled=True, init_layer=0.5, signal_min=10, explore_every=4)
    ctrl = _gate_at_batch_1(config)
    for n in (2, 6, 10, 4, 8, 3, 9):  # compute-bound: the cost alone would keep pruning
        ctrl.observe_forward(2e-3 + n * 1e-3, n * 8)
    assert ctrl.should_check(4, 1)
    for _ in range(12):
        ctrl.observe_outcome(PruneOutcome(pruned_reached=2, pruned_passed=1, kept_reached=2, kept_passed=1))
    assert ctrl.stats.has_signal(config) is False
    decisions = []
    for _ in range(8):
        ctrl.begin(["a"], [5])
        ctrl.begin_forward(6)
        decisions.append([ctrl.decide(layer, 1) for layer in (4, 5, 6)])
    # every explore_every-th step (steps 4 and 8) one layer, in turn, runs a shadow check; nothing is pruned
    assert decisions[2] == [SKIP, SHADOW, SKIP] and decisions[6] == [SKIP, SKIP, SHADOW]
    assert all(d == [SKIP] * 3 for i, d in enumerate(decisions) if i not in (2, 6))
    good = _gate_at_batch_1(config)
    for n in (2, 6, 10, 4, 8, 3, 9):
        good.observe_forward(2e-3 + n * 1e-3, n * 8)
    for _ in range(12):  # pruned nodes rarely pass: a real exit signal keeps the gate open
        good.observe_outcome(PruneOutcome(pruned_reached=3, pruned_passed=0, kept_reached=2, kept_passed=1))
    assert good.stats.has_signal(config) is True and good.should_check(4, 1)
    ctrl.observe_accept("r", 4, 1, pruned_passed=1)
    assert ctrl.stats.accept["r"] == 0.5


def test_a_shut_gate_still_times_a_check_every_explore_every_steps():
    """A line fitted from a few small checks can slope like a per-row average (faser:all, 2026-11-29: 4.3 ms at
    3 rows, never re-timed); one check every explore_every steps at the first check layer keeps it current."""
    config = EarlyExitConfig(enabled=True, init_layer=0.5, token_cost_s=4e-3, explore_every=5)
    ctrl = EarlyExitController(config, 8)
    ctrl.stats.t_prune = 1e-3
    for rows, secs in ((2, 2.9e-3), (3, 4.3e-3)) * 5:  # steep: 1.4 ms a row
        ctrl.observe_check(secs, rows)
    ctrl.observe_forward(40e-3, 5 * 8)
    checked = []
    for _ in range(10):
        ctrl.begin(["a", "b"], [2, 2])
        ctrl.begin_forward(6)
        checked.append([ctrl.decide(layer, 4) for layer in (4, 5, 6)])
    # steps 5 and 10, one layer each, in turn; shadow checks measure without pruning
    assert checked[4] == [SKIP, SHADOW, SKIP] and checked[9] == [SKIP, SKIP, SHADOW]
    assert sum(d != SKIP for row in checked for d in row) == 2


def _open_gate(config: EarlyExitConfig) -> EarlyExitController:
    """Compute-bound rows (1 ms each through 8 layers), cheap checks and prunes, 8 requests of 4 drafted."""
    ctrl = EarlyExitController(config, 8)
    ctrl.stats.t_prune = 1e-4
    for rows in (8, 16, 32):
        ctrl.observe_check(rows * 2e-5, rows)
    for n in (20, 40, 10, 30):
        ctrl.observe_forward(2e-3 + n * 1e-3, n * 8)
    ctrl.begin([str(i) for i in range(8)], [4] * 8)  # prior 0.5: k_rej = 16
    ctrl.begin_forward(40)
    return ctrl


def test_a_prune_leaves_k_rej_so_later_layers_price_what_is_left():
    """Before, k_rej stayed what the step began with, so a batch that pruned at one layer was checked again at
    every later one as if nothing had left (five checks a forward at 8x load, 2026-11-29)."""
    ctrl = _open_gate(EarlyExitConfig(enabled=True, init_layer=0.5))
    assert ctrl.decide(4, 8, live=32) == PRUNE
    ctrl.observe_check(1.6e-4, 8)
    ctrl.observe_prune(1e-4, rows=15)  # 15 rows left: about all the rejections expected
    assert ctrl.decide(5, 8, live=17) == SKIP  # one rejected row left: 1 x 2 layers x 0.125 ms < check + prune
    ctrl.begin([str(i) for i in range(8)], [4] * 8)
    ctrl.begin_forward(40)
    ctrl.stats.t_prune = 3e-4
    assert ctrl.decide(5, 8, live=32) == PRUNE
    assert ctrl.decide(5, 8, live=1) == SKIP  # k_rej cannot exceed the live drafted nodes


def test_acceptance_a_wrong_prune_costs_closes_the_gate():
    """eq. 10 with T_loss: where the nodes a layer flags would often pass, the tokens lost cost more than the
    rows saved, and that layer stays shut while a layer whose flags are right still prunes."""
    ctrl = _open_gate(EarlyExitConfig(enabled=True, init_layer=0.5))
    ctrl.observe_forward(42e-3, 40 * 8)
    for i in range(8):  # the forward emitted 16 tokens: t_tok = its time / 16
        ctrl.observe_accept(str(i), 4, 1)
    ctrl.begin([str(i) for i in range(8)], [4] * 8)
    ctrl.begin_forward(40)
    assert ctrl.stats.t_emitted == pytest.approx(42e-3 / 16)
    assert ctrl.decide(4, 8, live=32, depth_below=1.5) == SKIP  # nothing flagged yet: no signal assumed
    for _ in range(40):  # layer 4 flags nodes that pass 40 % of the time, layer 5 almost never
        ctrl.observe_outcome(
            PruneOutcome(pruned_reached=10, pruned_passed=2, kept_reached=10, kept_passed=6),
            {4: PruneOutcome(pruned_reached=5, pruned_passed=2), 5: PruneOutcome(pruned_reached=5, pruned_passed=0)},
        )
    assert ctrl.stats.has_signal(ctrl.config) is True  # globally the check does tell rejections apart ...
    assert 0.35 < ctrl.wrong_rate(4) < 0.45 and ctrl.wrong_rate(5) < 0.05
    assert ctrl.time_lost(4, 16, 1.5) > ctrl.time_lost(5, 16, 1.5)
    assert ctrl.decide(4, 8, live=32, depth_below=1.5) == SKIP  # ... but at layer 4 it would cost more than it saves
    assert ctrl.decide(5, 8, live=32, depth_below=1.5) == PRUNE


def test_shadow_flags_count_with_the_pruned_and_pass_on_the_path():
    #        root
    #      n0 -> n1 -> n2      chain; a shadow check flagged n1 (kept: accepted) and n2 (rejected)
    parents, tokens = [-1, 0, 1], [10, 11, 12]
    out = prune_outcome(parents, tokens, accepted_nodes=[0, 1], bonus=40, pruned=[], shadow=[1, 2])
    assert (out.pruned_reached, out.pruned_passed, out.kept_reached, out.kept_passed) == (2, 1, 1, 1)
    by_layer = layer_outcomes(parents, tokens, [0, 1], 40, [(1, 3, False), (2, 3, False), (2, 5, False)])
    assert (by_layer[3].pruned_reached, by_layer[3].pruned_passed) == (2, 1)
    assert (by_layer[5].pruned_reached, by_layer[5].pruned_passed) == (1, 0)
    # a real prune of n1 at layer 4 whose token is the bonus: it passed
    by_layer = layer_outcomes(parents, tokens, [0], 11, [(1, 4, True)])
    assert (by_layer[4].pruned_reached, by_layer[4].pruned_passed) == (1, 1)


def test_a_shadow_check_flags_without_pruning(deep_target):
    """Measuring costs no acceptance: a shadow check reports what it would prune and keeps every row."""

    class Shadow(EarlyExitController):
        def decide(self, layer, num_parent_rows, live=None, depth_below=0.0):
            return SHADOW if layer in self.layers else SKIP

    config = EarlyExitConfig(enabled=True, init_layer=1, k_init=1, k_final=1)
    target = TargetEngine(make_runner(deep_target), early_exit=config)
    target.early_exit = ctrl = Shadow(config, 6)
    target.prefill([PrefillItem("a", [1, 2, 3, 4, 5])])
    seq = target.runner.get("a")
    tree = TokenTree([5, 7, 9, 11], [-1, 0, 0, 1])
    ctrl.begin(["a"], [len(tree)])
    out = target.runner.forward(
        [Work(seq, new_nodes=list(zip(tree.token_ids, tree.parent_ids)), want_root=True, want_nodes=True)],
        early_exit=ctrl,
    )
    assert out.pruned == [[]] and seq.tree.pruned == set()
    assert out.flags[0] and all(not was_pruned for _, _, was_pruned in out.flags[0])
    assert {layer for _, layer, _ in out.flags[0]} <= set(ctrl.layers)
    target.release(["a"])
    target.runner.check_accounting()
