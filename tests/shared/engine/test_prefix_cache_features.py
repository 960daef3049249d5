"""Target features from cached prefix blocks: a warm cache returns what a cold full recompute returns.

A step that returns features (an EAGLE draft's) shares the cached blocks whose feature rows are stored
beside their KV and answers those rows first, then the computed ones. Turn 2 of a conversation extends
turn 1's prompt and answer (whose blocks were filled by verify steps, their rows moved along the
accepted path); its features, whole or in chunks, equal a prefill of the same prompt on an engine with
the cache off. Blocks registered by a step without features are not shared with a feature step (a
later feature step that computes the same block gives it its rows), and accounting holds under
eviction pressure with features on.
"""

import random

import pytest
import torch

from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem

from conftest import make_runner

VOCAB = 96
SPEC = FeatureSpec((0, 1, 2), "float32")  # the tiny target has 2 layers: 2 = the last layer's output
TOL = 1e-6


def engine(model, *, prefix_caching=True, num_blocks=512):
    return TargetEngine(make_runner(model, block_size=4, num_blocks=num_blocks, prefix_caching=prefix_caching))


def prefill(target, sid, prompt, *, chunk=0, spec=SPEC):
    """Prefill (in chunks when ``chunk``); returns (first token, the joined feature block or None)."""
    res = target.prefill([PrefillItem(sid, prompt, max_tokens=chunk)], features=spec)[0]
    blocks = [res.features]
    while res.pending:
        res = target.prefill([PrefillItem(sid, [], max_tokens=chunk, resume=True)], features=spec)[0]
        blocks.append(res.features)
    return res.first_token, FeatureBlock.join([b for b in blocks if b is not None])


def oracle_tree(next_tokens):
    """A tree whose accepted path is nodes 1, 2 (node 0 is a wrong sibling): the commit moves its KV."""
    a, b = next_tokens
    return TokenTree(token_ids=[(a + 1) % VOCAB, a, b, (b + 1) % VOCAB], parent_ids=[-1, -1, 1, 1])


def decode(target, sid, prompt, reference, steps, *, spec=SPEC):
    """Prefill, then ``steps`` verifies of oracle trees; returns the committed tokens after the prompt."""
    first, _ = prefill(target, sid, prompt, spec=spec)
    want = reference.greedy(prompt, 3 * steps + 1)
    out = [first]
    for _ in range(steps):
        k = len(out)
        res = target.verify([VerifyItem(sid, oracle_tree(want[k : k + 2]))], features=spec)[0]
        assert res.accepted_nodes == [1, 2]
        out += res.tokens
    assert out == want[: len(out)]
    return out


def max_diff(a: FeatureBlock, b: FeatureBlock) -> float:
    assert (a.start, a.num_rows, a.width, a.dtype) == (b.start, b.num_rows, b.width, b.dtype)
    return float((a.to_tensor() - b.to_tensor()).abs().max())


@pytest.fixture
def conversation(target_model, reference):
    """(warm engine after turn 1, turn 2's prompt): turn 2 = turn 1's prompt + answer + a new message."""
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(14)]
    warm = engine(target_model)
    answer = decode(warm, "turn1", prompt, reference, steps=3)
    warm.release(["turn1"])
    return warm, prompt + answer + [rng.randrange(VOCAB) for _ in range(5)]


@pytest.mark.parametrize("chunk", [0, 3, 5])
def test_warm_features_equal_a_cold_recompute(target_model, conversation, chunk):
    warm, prompt = conversation
    index = warm.runner.cache.allocator.prefix
    hits = index.hits
    first, block = prefill(warm, "turn2", prompt, chunk=chunk)
    served = index.hits - hits
    assert served >= 20, served  # turn 1's prompt and most of its answer (blocks filled by verifies)
    cold_first, cold = prefill(engine(target_model, prefix_caching=False), "turn2", prompt)
    assert first == cold_first
    assert (block.start, block.end) == (0, len(prompt))
    assert max_diff(block, cold) <= TOL
    warm.runner.check_accounting()


def test_verified_rows_equal_a_cold_recompute(target_model, reference):
    """Rows a verify returns (fed token, then the moved accepted path) match a prefill of the sequence."""
    target = engine(target_model)
    prompt = list(range(3, 16))
    first, block = prefill(target, "s", prompt)
    blocks, out = [block], [first]
    want = reference.greedy(prompt, 10)
    for _ in range(3):
        res = target.verify([VerifyItem("s", oracle_tree(want[len(out) : len(out) + 2]))], features=SPEC)[0]
        blocks.append(res.features)
        out += res.tokens
    joined = FeatureBlock.join(blocks)
    seq = prompt + out
    _, cold = prefill(engine(target_model, prefix_caching=False), "s", seq[:-1])
    assert max_diff(joined, cold) <= TOL


def test_blocks_without_rows_are_a_miss_for_feature_steps(target_model):
    """Blocks 0-2 have rows, 3-5 were registered by a step without features: a feature step shares 0-2 only."""
    target = engine(target_model)
    index = target.runner.cache.allocator.prefix
    rng = random.Random(5)
    base = [rng.randrange(VOCAB) for _ in range(13)]  # blocks 0-2 full, +1 token
    more = base[:12] + [rng.randrange(VOCAB) for _ in range(13)]  # blocks 3-5 full, +1 token
    prefill(target, "a", base)
    target.prefill([PrefillItem("b", more)])  # no features: shares 0-2, registers 3-5 without rows
    longer = more[:24] + [rng.randrange(VOCAB) for _ in range(6)]
    hits = index.hits
    _, block = prefill(target, "c", longer)
    assert index.hits - hits == 12  # blocks 0-2 only
    _, cold = prefill(engine(target_model, prefix_caching=False), "c", longer)
    assert max_diff(block, cold) <= TOL
    # "c" computed blocks 3-5 again, with rows: the cached equal blocks took them, so the next feature step
    # shares all seven full blocks (0-2 from "a", 3-5 from "b" with c's rows, 6 from "c")
    hits = index.hits
    _, block = prefill(target, "d", longer[:29])
    assert index.hits - hits == 28
    _, cold = prefill(engine(target_model, prefix_caching=False), "d", longer[:29])
    assert max_diff(block, cold) <= TOL
    # another layer set: nothing stored for it, so nothing is shared
    other = FeatureSpec((1,), "float32")
    hits = index.hits
    _, block = prefill(target, "e", longer[:29], spec=other)
    assert index.hits == hits
    target.runner.check_accounting()


def test_accounting_and_features_hold_under_eviction(target_model, reference):
    """Random feature and plain traffic over shared prefixes on a small pool: every block accounted for, and
    a feature prefill from whatever is cached (evicted and reused blocks included) equals a cold one."""
    rng = random.Random(11)
    target = engine(target_model, num_blocks=24)
    cold = engine(target_model, prefix_caching=False)
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.choice([8, 12, 16]))] for _ in range(5)]
    live: list[str] = []
    for step in range(90):
        op = rng.random()
        if op < 0.45 or not live:
            sid = f"p{step}"
            prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 7))]
            spec = SPEC if rng.random() < 0.75 else None
            try:
                first, block = prefill(target, sid, prompt, chunk=rng.choice([0, 0, 3]), spec=spec)
            except Exception as exc:  # the pool is small: a refused step changes nothing
                assert type(exc).__name__ == "OutOfBlocksError", exc
                if sid in target.runner.seqs:  # a later chunk was refused: give up on it
                    target.release([sid])
                target.runner.check_accounting()
                continue
            live.append(sid)
            if spec is not None:
                cold_first, want = prefill(cold, sid, prompt)
                cold.release([sid])
                assert first == cold_first and max_diff(block, want) <= TOL
        elif op < 0.85:
            sid = rng.choice(live)
            seq = target.runner.get(sid)
            a = reference.greedy(seq.token_ids, 2)
            try:
                target.verify([VerifyItem(sid, oracle_tree(a))], features=SPEC if rng.random() < 0.8 else None)
            except Exception as exc:
                assert type(exc).__name__ in ("OutOfBlocksError", "ContextLengthError"), exc
        else:
            target.release([live.pop(rng.randrange(len(live)))])
        target.runner.check_accounting()
    target.release(live)
    target.runner.check_accounting()
    assert target.runner.cache.num_free_blocks == target.runner.cache.num_blocks
    assert target.runner.cache.allocator.prefix.evictions > 0
    assert target.runner.cache.allocator.prefix.hits > 0
    assert torch.is_tensor(target.runner.cache.features.rows)


def test_no_room_for_feature_rows_falls_back_to_recomputing(target_model, reference, monkeypatch):
    """A device without room for the rows beside the pool keeps no store: feature steps share nothing and
    compute every token, with the same features as a cold engine; plain steps still share."""
    from shared.engine import kv_cache

    assert kv_cache.feature_store_fits(torch.device("cpu"), 1 << 40)  # host memory is not checked
    gib = 1 << 30
    assert kv_cache.feature_store_fits(torch.device("cuda"), 6 * gib, free_total=(10 * gib, 80 * gib))
    assert not kv_cache.feature_store_fits(torch.device("cuda"), 7 * gib, free_total=(10 * gib, 80 * gib))  # 5 % of 80 GiB stays free
    monkeypatch.setattr(kv_cache, "feature_store_fits", lambda device, num_bytes: False)
    rng = random.Random(5)
    prompt = [rng.randrange(VOCAB) for _ in range(14)]
    warm = engine(target_model)
    answer = decode(warm, "turn1", prompt, reference, steps=3)
    warm.release(["turn1"])
    assert warm.runner.cache.features is None
    index = warm.runner.cache.allocator.prefix
    turn2 = prompt + answer + [rng.randrange(VOCAB) for _ in range(5)]
    hits = index.hits
    first, block = prefill(warm, "turn2", turn2)
    assert index.hits == hits  # nothing shared with a feature step
    cold_first, cold = prefill(engine(target_model, prefix_caching=False), "turn2", turn2)
    assert first == cold_first and max_diff(block, cold) <= TOL
    warm.release(["turn2"])
    warm.prefill([PrefillItem("plain", turn2)])  # a step without features still shares the blocks
    assert index.hits > hits
    warm.runner.check_accounting()
