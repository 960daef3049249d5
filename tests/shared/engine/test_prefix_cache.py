"""Automatic prefix caching: shared prompt blocks give the same tokens, and every block stays accounted for.

The property test drives random traffic (prefills of prompts built from a few
common prefixes, so blocks are shared and reused; speculate / verify; chunked
prefills; aborts) through a target and a draft on a pool small enough that
cached blocks are evicted and some steps are refused. After every operation
each block is free, cached, or held by exactly as many live sequences as its
reference count says; at the end every block is free or cached.
"""

import random

import pytest

from shared.engine.draft_engine import DraftEngine
from shared.engine.errors import ContextLengthError, OutOfBlocksError
from shared.engine.prefix_cache import ROOT, block_key
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem

from conftest import make_runner

VOCAB = 96
NUM_TOKENS = 12


def decode(target, draft, sid, prompt, *, salt="", chunk=0, chain=3, sampling=None):
    """Prefill (in chunks of ``chunk`` when > 0) then speculate/verify until NUM_TOKENS; returns the tokens."""
    sampling = sampling or SamplingParams()
    item = PrefillItem(sid, prompt, sampling, max_tokens=chunk, cache_salt=salt)
    res = target.prefill([item])[0]
    draft.prefill([PrefillItem(sid, prompt, sampling, max_tokens=chunk, cache_salt=salt)])
    while res.pending:
        res = target.prefill([PrefillItem(sid, [], sampling, max_tokens=chunk, resume=True)])[0]
        draft.prefill([PrefillItem(sid, [], sampling, max_tokens=chunk, resume=True)])
    out, new = [res.first_token], [res.first_token]
    while len(out) < NUM_TOKENS:
        tree = draft.speculate([SpecItem(sid, new, chain_len=chain)])[0]
        new = target.verify([VerifyItem(sid, tree)])[0].tokens
        out += new
    return out[:NUM_TOKENS]


def engines(target_model, draft_model, *, prefix_caching=True, num_blocks=512):
    kw = dict(block_size=4, num_blocks=num_blocks, prefix_caching=prefix_caching)
    return TargetEngine(make_runner(target_model, **kw)), DraftEngine(make_runner(draft_model, **kw))


def test_block_key_chains_the_prefix_and_the_salt():
    a = block_key(ROOT, [1, 2, 3, 4])
    assert a == block_key(ROOT, [1, 2, 3, 4]) and a != block_key(ROOT, [1, 2, 3, 5])
    assert block_key(a, [5, 6, 7, 8]) != block_key(block_key(ROOT, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert block_key(ROOT, [1, 2, 3, 4], "tenant-a") != a


@pytest.mark.parametrize("chain", [0, 3])
def test_multi_turn_warm_cache_is_greedy_exact_and_hits(target_model, draft_model, reference, chain):
    """A conversation: each turn's prompt is the last turn's prompt + output + a new message."""
    warm_t, warm_d = engines(target_model, draft_model)
    rng = random.Random(7)
    history = [rng.randrange(VOCAB) for _ in range(9)]
    for turn in range(4):
        out = decode(warm_t, warm_d, f"turn{turn}", history, chain=chain)
        assert out == reference.greedy(history, NUM_TOKENS), turn
        warm_t.release([f"turn{turn}"])
        warm_d.release([f"turn{turn}"])
        history = history + out + [rng.randrange(VOCAB) for _ in range(5)]
    index = warm_t.runner.cache.allocator.prefix
    assert index.hits > 0 and 0 < index.hit_rate < 1
    assert warm_d.runner.cache.allocator.prefix.hits > 0
    for engine in (warm_t, warm_d):
        engine.runner.check_accounting()
        assert engine.runner.cache.num_free_blocks == engine.runner.cache.num_blocks  # cached blocks count as free


def test_live_sequences_share_prompt_blocks_and_copy_on_write(target_model, draft_model, reference):
    """n samples of one prompt: the second and third share the first's full blocks (ref counts 3)."""
    target, draft = engines(target_model, draft_model)
    prompt = list(range(1, 18))  # 4 full blocks + 1 token
    first = decode(target, draft, "s0", prompt)
    blocks0 = target.runner.get("s0").block_ids[:4]
    outs = [decode(target, draft, f"s{i}", prompt, chain=i) for i in (1, 2)]
    assert outs == [first, first] == [reference.greedy(prompt, NUM_TOKENS)] * 2
    assert all(target.runner.cache.allocator.ref(b) == 3 for b in blocks0)
    assert target.runner.get("s1").block_ids[:4] == blocks0
    target.runner.check_accounting()
    target.release(["s0", "s1", "s2"])
    draft.release(["s0", "s1", "s2"])
    target.runner.check_accounting()


def test_salt_isolates_and_opt_out_never_shares(target_model, draft_model):
    target, draft = engines(target_model, draft_model)
    prompt = list(range(3, 23))
    decode(target, draft, "a", prompt, salt="tenant-a")
    index = target.runner.cache.allocator.prefix
    decode(target, draft, "b", prompt, salt="tenant-b")
    assert index.hits == 0
    decode(target, draft, "c", prompt, salt="tenant-a")
    assert index.hits == 16  # (len - 1) // 4 full blocks before the last prompt token
    off_t, off_d = engines(target_model, draft_model, prefix_caching=False)
    decode(off_t, off_d, "a", prompt)
    decode(off_t, off_d, "b", prompt)
    assert off_t.runner.cache.allocator.prefix.hits == 0 and off_t.runner.cache.allocator.num_cached == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_traffic_with_shared_prefixes_keeps_every_block_accounted_for(seed, target_model, draft_model):
    rng = random.Random(seed)
    target, draft = engines(target_model, draft_model, num_blocks=48)
    bases = [[rng.randrange(VOCAB) for _ in range(rng.randint(4, 20))] for _ in range(3)]
    live: dict[str, list[int]] = {}  # committed on the target, not yet seen by the draft
    pending: set[str] = set()  # chunked prefills in progress
    refused = 0

    def abort(ids):
        target.release(ids)
        draft.release(ids)
        for sid in ids:
            live.pop(sid, None)
            pending.discard(sid)

    for step in range(150):
        op = rng.choice(["prefill", "prefill", "resume", "verify", "verify", "abort"])
        try:
            if op == "resume" and pending:
                sid = rng.choice(sorted(pending))
                item = PrefillItem(sid, [], max_tokens=rng.randint(1, 9), resume=True)
                res = target.prefill([item])[0]
                if not res.pending:
                    pending.discard(sid)
                    live[sid] = [res.first_token]
                draft.prefill([item])  # refused: the draft is behind, and its first speculate runs the rest
            elif op in ("prefill", "resume") or not live:
                sid = f"r{step}"
                prompt = rng.choice(bases) + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 10))]
                sampling = SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=step)
                item = PrefillItem(sid, prompt, sampling, max_tokens=rng.choice([0, 0, 3, 8]))
                res = target.prefill([item])[0]
                try:
                    draft.prefill([item])
                except OutOfBlocksError:
                    target.release([sid])
                    raise
                (pending.add(sid) if res.pending else live.__setitem__(sid, [res.first_token]))
            elif op == "verify":
                ids = rng.sample(sorted(live), rng.randint(1, len(live)))
                specs = [SpecItem(s, live[s], chain_len=rng.randint(0, 4)) for s in ids]
                try:
                    trees = draft.speculate(specs)
                except OutOfBlocksError:
                    abort(ids)
                    raise
                for s in ids:
                    live[s] = []
                for s, res in zip(ids, target.verify([VerifyItem(s, t) for s, t in zip(ids, trees)])):
                    live[s] = res.tokens
            else:
                abort(rng.sample(sorted(live) + sorted(pending), 1))
        except (OutOfBlocksError, ContextLengthError):
            refused += 1
        target.runner.check_accounting()
        draft.runner.check_accounting()
        for sid in [s for s in live if target.runner.get(s).num_committed > 80]:
            abort([sid])
    assert refused > 0, "the pool never filled: the test did not exercise pressure"
    index = target.runner.cache.allocator.prefix
    assert index.hits > 0 and index.evictions > 0
    abort(sorted(live) + sorted(pending))
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert engine.runner.cache.num_free_blocks == engine.runner.cache.num_blocks
