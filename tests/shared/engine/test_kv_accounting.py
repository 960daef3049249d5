"""KV accounting under random traffic: every block is owned by a live request or free.

A seeded random walk over prefill / speculate / verify (accepting whatever the
target accepts, i.e. committing a path and rolling back the rest) / abort, on a
pool small enough that some steps run out of blocks and must be refused without
side effects. The invariant is checked after every operation, and at the end,
releasing everything returns the whole pool.
"""

import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, TokenTree, VerifyItem

from conftest import make_runner

VOCAB = 96
STEPS = 120


def random_tree(rng: random.Random, max_nodes: int) -> TokenTree:
    n = rng.randint(0, max_nodes)
    parents = [rng.randint(-1, i - 1) for i in range(n)]
    return TokenTree(token_ids=[rng.randrange(VOCAB) for _ in range(n)], parent_ids=parents)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_keeps_every_block_accounted_for(seed, target_model, draft_model):
    rng = random.Random(seed)
    target = TargetEngine(make_runner(target_model, num_blocks=40, block_size=4, max_context=96))
    draft = DraftEngine(make_runner(draft_model, num_blocks=40, block_size=4, max_context=96))
    live: dict[str, list[int]] = {}  # seq id -> tokens the target committed that the draft has not seen yet
    refused = 0

    def abort(ids: list[str]) -> None:
        target.release(ids)
        draft.release(ids)
        for sid in ids:
            del live[sid]

    for step in range(STEPS):
        op = rng.choice(["prefill", "prefill", "draft_verify", "draft_verify", "garbage_verify", "abort"])
        try:
            if op == "prefill" or not live:
                sid = f"r{step}"
                prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
                sampling = SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=step)
                first = target.prefill([PrefillItem(sid, prompt, sampling)])[0].first_token
                try:
                    draft.prefill([PrefillItem(sid, prompt, sampling)])
                except OutOfBlocksError:
                    target.release([sid])
                    raise
                live[sid] = [first]
            elif op == "draft_verify":
                ids = rng.sample(sorted(live), rng.randint(1, len(live)))
                specs = [
                    SpecItem(s, live[s], chain_len=rng.randint(0, 4))
                    if rng.random() < 0.5
                    else SpecItem(s, live[s], tree_depth=rng.randint(1, 3), tree_width=rng.randint(1, 3))
                    for s in ids
                ]
                try:
                    trees = draft.speculate(specs)
                except OutOfBlocksError:  # the draft's state is unknown now: abort, as the scheduler resyncs
                    abort(ids)
                    raise
                for s in ids:  # the draft has seen them
                    live[s] = []
                results = target.verify([VerifyItem(s, t) for s, t in zip(ids, trees)])
                for s, res in zip(ids, results):
                    live[s] = res.tokens  # committed by the target; the draft gets them next time
            elif op == "garbage_verify":
                sid = rng.choice(sorted(live))
                live[sid] += target.verify([VerifyItem(sid, random_tree(rng, 8))])[0].tokens
            else:
                abort([rng.choice(sorted(live))])
        except (OutOfBlocksError, ContextLengthError):
            refused += 1
            # a sequence too long to go on is aborted, as the scheduler would
            abort([s for s in live if target.runner.get(s).num_committed > 80])
        target.runner.check_accounting()
        draft.runner.check_accounting()
        assert set(target.runner.seqs) == set(live)

    assert refused > 0, "the pool never ran out: the walk did not exercise refusals"
    target.release(list(live))
    draft.release(list(live))
    for engine_runner in (target.runner, draft.runner):
        engine_runner.check_accounting()
        assert engine_runner.cache.num_free_blocks == engine_runner.cache.num_blocks
