"""The loop's draft relay (scheduler/draft_relay.py) over in-process engines: a target worker that relays as the
target service does (the draft drafts each handed-off step right after the verify; the next plan takes the
tree), lossless against target-only greedy, nothing leaked; trees that never come and shapes that change
cost speculation, never tokens. The services' side is tested over gRPC in tests/services/test_relay_over_grpc.py."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from scheduler.draft_relay import DraftRelay
from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.adaserve import AdaServe, SpecInferTree
from scheduler.policies.speculation import FixedChain, SpeculationPolicy
from scheduler.spec_shape import SpecShape
from shared.engine.config import EngineConfig
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.spec_cap import capped_item, cut_chain
from shared.engine.tree_cut import cut_to_expansion
from shared.engine.types import RELAY_TAKE, VerifyItem
from tests.scheduler.test_local_workers import greedy, serve_prompts


class Expansion(SpeculationPolicy):
    """A fixed 2-2 expansion tree, every drafted node verified (no selector)."""

    def decide(self, batch, ctx):
        return [SpecShape.expanded((2, 2))] * len(batch)


class RelayingTarget(LocalTargetWorker):
    """A local target that relays as services/target/relay_plan.py does; ``lose`` drops every n-th relayed tree."""

    relay_to = "in-process"

    def __init__(self, engine, draft_engine, lose: int = 0) -> None:
        super().__init__(engine)
        self.draft_engine, self.lose, self.trees, self.num_handed = draft_engine, lose, {}, 0

    async def verify(self, items):
        return (await self.step([], items))[1]

    async def step(self, prefills, verifies: list[VerifyItem]):
        taken, missed = {}, set()
        for item in verifies:
            if item.relay:
                tree = self.trees.pop(item.seq_id, None)
                if tree is None:
                    missed.add(item.seq_id)
                elif item.relay == RELAY_TAKE:
                    item.tree = taken[item.seq_id] = cut_chain(tree, item.relay_cut)  # as relay_plan.py and draft_relay.py
        prefilled, results = await super().step(prefills, verifies)
        handoffs = []
        for item, res in zip(verifies, results):
            res.relay_tree, res.relay_missed = taken.get(item.seq_id), item.seq_id in missed
            if item.handoff is not None and item.seq_id in self.draft_engine.runner.seqs:
                spec = capped_item(replace(item.handoff, new_tokens=item.handoff.new_tokens + res.tokens),
                                   item.remaining - len(res.tokens) - 1)  # fmt: skip
                if spec is not None:
                    handoffs.append(spec)
                    res.relayed = True
        if handoffs:
            trees = await asyncio.to_thread(self.draft_engine.speculate, handoffs)
            for spec, tree in zip(handoffs, trees):
                tree = cut_to_expansion(tree, spec.tree_expansion)
                self.num_handed += 1
                if not (self.lose and self.num_handed % self.lose == 0):
                    self.trees[spec.seq_id] = tree
        return prefilled, results

    async def release(self, seq_ids):
        for seq_id in seq_ids:
            self.trees.pop(seq_id, None)
        await super().release(seq_ids)


def _engines(model_dir):
    config = EngineConfig(num_blocks=64, block_size=4)
    target, _ = build_target_engine(model_dir, device="cpu", engine_config=config)
    draft, _ = build_draft_engine(model_dir, device="cpu", engine_config=config)
    return target, draft


@pytest.mark.parametrize("policy", [FixedChain(3), Expansion(), SpecInferTree((2, 2))],
                         ids=["chain3", "tree2-2", "specinfer2-2"])  # fmt: skip
def test_relayed_steps_are_lossless_and_skip_the_speculate_call(tiny_model_dir, policy):
    from services.scheduler.observers.metrics import MetricsObserver
    from shared.metrics import TandemMetrics

    target, draft = _engines(tiny_model_dir)
    worker = LocalDraftWorker(draft)
    sched = Scheduler(RelayingTarget(target, draft), worker, spec_policy=policy, config=SchedulerConfig(draft_relay=True))
    assert isinstance(sched.relay, DraftRelay) and sched.ahead is None
    metrics = TandemMetrics()
    sched.add_observer(MetricsObserver(metrics, sched))
    reqs, outs = serve_prompts(sched, [target, draft])
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    relay = sched.relay
    assert relay.num_relayed > 0 and relay.gate.num_hits > 0 and relay.gate.num_misses == 0 and relay.num_missed == 0
    assert all(sum(r.accepted_lens) > 0 for r in reqs)  # the relayed trees were verified and recorded
    if policy.static_shapes:  # the verify went ahead of the commit (verify_ahead.py)
        assert sched.verify_ahead is not None and sched.verify_ahead.num_sent > 0
    else:
        assert sched.verify_ahead is None
    read = metrics.registry.get_sample_value
    assert read("tandem_draft_relay_total", {"event": "handed_off"}) == relay.num_relayed
    assert (read("tandem_draft_relay_total", {"event": "verify_ahead"}) or 0) == (
        sched.verify_ahead.num_sent if sched.verify_ahead else 0)


def test_trees_that_never_come_cost_a_decode_step_and_a_resync(tiny_model_dir):
    target, draft = _engines(tiny_model_dir)
    sched = Scheduler(RelayingTarget(target, draft, lose=3), LocalDraftWorker(draft), spec_policy=FixedChain(3),
                      config=SchedulerConfig(draft_relay=True))  # fmt: skip
    reqs, outs = serve_prompts(sched, [target, draft])
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.relay.num_missed > 0 and sched.relay.gate.num_hits > 0


class Alternating(FixedChain):
    """A chain of 2 or 3 by step parity: a relayed chain of 3 is cut to 2, one of 2 serves a plan of 3."""

    static_shapes = False

    def decide(self, batch, ctx):
        return [SpecShape.chain(2 + ctx.step % 2)] * len(batch)


class AlternatingTree(SpeculationPolicy):
    """A 2-2 or a 2-1 expansion by step parity: a relayed tree of the other shape is dropped (a plain decode step)."""

    def decide(self, batch, ctx):
        return [SpecShape.expanded((2, 2 - ctx.step % 2))] * len(batch)


def test_a_changed_chain_length_cuts_or_keeps_the_relayed_chain(tiny_model_dir):
    target, draft = _engines(tiny_model_dir)
    sched = Scheduler(RelayingTarget(target, draft), LocalDraftWorker(draft), spec_policy=Alternating(3),
                      config=SchedulerConfig(draft_relay=True))  # fmt: skip
    reqs, outs = serve_prompts(sched, [target, draft])
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.relay.gate.num_misses > 0 and sched.relay.gate.num_hits > 0  # a plan longer than the relayed chain
    assert all(max(r.drafted_depths) == 2 for r in reqs)  # cut to the plan's 2, or relayed as 2: never 3 verified


def test_a_changed_tree_shape_drops_the_relayed_tree(tiny_model_dir):
    target, draft = _engines(tiny_model_dir)
    sched = Scheduler(RelayingTarget(target, draft), LocalDraftWorker(draft), spec_policy=AlternatingTree(),
                      config=SchedulerConfig(draft_relay=True))  # fmt: skip
    reqs, outs = serve_prompts(sched, [target, draft])
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    assert sched.relay.gate.num_misses > 0


def test_no_relay_without_a_relaying_target_or_with_tree_selection(tiny_model_dir):
    target, draft = _engines(tiny_model_dir)
    off = Scheduler(RelayingTarget(target, draft), LocalDraftWorker(draft), spec_policy=FixedChain(3),
                    config=SchedulerConfig(draft_relay=False, draft_ahead=True))  # fmt: skip
    assert off.relay is None and off.ahead is not None
    selecting = Scheduler(RelayingTarget(target, draft), LocalDraftWorker(draft), spec_policy=AdaServe(),
                          config=SchedulerConfig(draft_relay=True, draft_ahead=True))  # fmt: skip
    assert selecting.relay is None and selecting.ahead is not None  # the scheduler must see the trees to select
