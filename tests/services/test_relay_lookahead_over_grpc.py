"""Relay lookahead over real services: the draft answers each handoff with the tree after the next one too, and a
step that commits exactly its assumed prefix verifies it without waiting. Greedy output stays the target's,
whether the lookaheads are all taken (the draft is the target) or some are and some roll back (a draft
that disagrees now and then)."""

from __future__ import annotations

import asyncio

import pytest

from shared.engine.types import RELAY_TAKE, PrefillItem, SpecItem, VerifyItem
from tests.services.test_relay_over_grpc import relaying
from tests.support.model_services import greedy_reference

PROMPTS = {"a": [3, 14, 15, 92, 65, 35], "b": [27, 18, 28, 18, 28]}


@pytest.fixture(scope="module")
def noisy_draft_dir(tmp_path_factory):
    """The tiny llama with noise on every weight: it agrees with the target on some tokens, not all."""
    import torch

    from shared.models.tiny import build_tiny

    model = build_tiny("llama")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * p.std())
    path = tmp_path_factory.mktemp("models") / "tiny-llama-noisy"
    model.save_pretrained(path)
    return path


async def _serve(target_dir, draft_dir, shape: dict, steps: int) -> tuple[dict[str, list[int]], int, object]:
    async with relaying(target_dir, draft_dir, relay_lookahead="always") as (target, draft, tw, dw):
        items = [PrefillItem(k, p) for k, p in PROMPTS.items()]
        firsts = [r.first_token for r in await tw.prefill(items)]
        await dw.prefill(items)
        out = {k: [t] for k, t in zip(PROMPTS, firsts)}
        trees = await dw.speculate([SpecItem(k, [t], **shape) for k, t in zip(PROMPTS, firsts)])
        verifies = [VerifyItem(k, tree, handoff=SpecItem(k, [], **shape), remaining=99) for k, tree in zip(PROMPTS, trees)]
        for _ in range(steps):
            for item, res in zip(verifies, await tw.verify(verifies)):
                assert not res.relay_missed and res.relayed
                out[item.seq_id] += res.tokens
            verifies = [VerifyItem(k, relay=RELAY_TAKE, handoff=SpecItem(k, [], **shape), remaining=99 - len(out[k]))
                        for k in PROMPTS]  # fmt: skip
        await tw.release(list(PROMPTS))
        await tw.flush()  # the releases wait for the last handoff's answers: the draft has taken them all
        return out, tw.relay_lookaheads, draft.engine_host.relay_lookahead


@pytest.mark.parametrize("shape", [{"chain_len": 3}, {"tree_depth": 2, "tree_width": 4, "tree_expansion": (2, 2)}],
                         ids=["chain", "expansion"])  # fmt: skip
def test_a_draft_that_is_the_target_has_every_lookahead_taken(tiny_model_dir, shape):
    out, looked, draft = asyncio.run(_serve(tiny_model_dir, tiny_model_dir, shape, steps=8))
    for k, prompt in PROMPTS.items():
        assert out[k] == greedy_reference(tiny_model_dir, tuple(prompt), len(out[k]))
    # step 1 verifies the scheduler's trees, step 2 the first answer's; from step 3 on every tree is a lookahead,
    # which the handoffs after steps 2-8 took on the draft (the last one's is not verified here)
    assert looked == 2 * 6 and draft.num_taken == 2 * 7


def test_a_draft_that_disagrees_rolls_back_and_the_output_is_still_the_targets(tiny_model_dir, noisy_draft_dir):
    out, looked, draft = asyncio.run(_serve(tiny_model_dir, noisy_draft_dir, {"chain_len": 2}, steps=24))
    for k, prompt in PROMPTS.items():
        assert out[k] == greedy_reference(tiny_model_dir, tuple(prompt), len(out[k]))
    assert 0 < looked < 2 * 22  # some taken, some rolled back
    assert looked <= draft.num_taken <= looked + 2  # the last handoff's takes are not verified here


def test_schedulers_relaying_through_one_target_write_their_handoffs_in_turn(tiny_model_dir):
    """Each scheduler's step stream hands off on the target's one relay stream: two flushes at once must not write
    at once (gRPC fails a call given two writes together, and the relay's trees would be missed for a while)."""
    from services.scheduler.stream_workers import StreamDraftWorker, StreamTargetWorker

    async def drive(tw, dw, seq_id):
        out = [(await tw.prefill([PrefillItem(seq_id, PROMPTS["a"])]))[0].first_token]
        await dw.prefill([PrefillItem(seq_id, PROMPTS["a"])])
        tree = (await dw.speculate([SpecItem(seq_id, [out[0]], chain_len=2)]))[0]
        item = VerifyItem(seq_id, tree, handoff=SpecItem(seq_id, [], chain_len=2), remaining=99)
        missed = 0
        for _ in range(12):
            res = (await tw.verify([item]))[0]
            missed += res.relay_missed
            out += res.tokens
            item = VerifyItem(seq_id, relay=RELAY_TAKE, handoff=SpecItem(seq_id, [], chain_len=2), remaining=99 - len(out))
        return out, missed

    async def main():
        async with relaying(tiny_model_dir, relay_lookahead="always") as (target, draft, tw, dw):
            more = [(StreamTargetWorker(target.address), StreamDraftWorker(draft.address)) for _ in range(3)]
            for w, _ in more:
                w.relay_to = draft.address
            try:
                pairs = [(tw, dw), *more]
                return await asyncio.gather(*(drive(t, d, f"s{k}") for k, (t, d) in enumerate(pairs)))
            finally:
                for t, d in more:
                    await t.close()
                    await d.close()

    for out, missed in asyncio.run(main()):
        assert missed == 0
        assert out == greedy_reference(tiny_model_dir, tuple(PROMPTS["a"]), len(out))


def test_a_take_the_draft_does_not_confirm_is_missed_and_resynchronised_and_nothing_is_lost(tiny_model_dir):
    """Both sides decide a take from the same facts, so the target writes each handoff without waiting for the last
    answer. Here the draft's answers deny some takes it made: the target, which took them, misses those sequences
    at their next verify, and the scheduler's loop resynchronises them; greedy output stays the target's."""
    from scheduler.engine_loop import Scheduler, SchedulerConfig
    from scheduler.policies.speculation import FixedChain
    from scheduler.request import Request

    reqs = [Request(id=k, prompt_ids=p, max_new_tokens=40) for k, p in PROMPTS.items()]

    async def main():
        async with relaying(tiny_model_dir, relay_lookahead="always") as (target, draft, tw, dw):
            lookaheads = draft.engine_host.relay_lookahead
            run, calls = lookaheads.run, [0]

            def denying(*args):
                fresh, looks, bad, taken = run(*args)
                calls[0] += 1
                return fresh, looks, bad, taken if calls[0] % 5 else set()  # every fifth answer denies its takes

            lookaheads.run = denying
            sched = Scheduler(tw, dw, spec_policy=FixedChain(3), config=SchedulerConfig(draft_relay=True))
            outs = await asyncio.gather(*(s.collect() for s in [sched.submit(r) for r in reqs]), sched.run_until_idle())
            await tw.flush()
            return outs[:-1], sched.relay.num_missed, tw.relay_lookaheads, await tw.info(), await dw.info()

    outs, missed, looked, tinfo, dinfo = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert out == greedy_reference(tiny_model_dir, tuple(req.prompt_ids), req.max_new_tokens), req.id
    assert missed > 0 and looked > 0  # takes denied, then missed; the others verified without waiting
    assert tinfo.num_live_seqs == 0 and dinfo.num_live_seqs == 0
