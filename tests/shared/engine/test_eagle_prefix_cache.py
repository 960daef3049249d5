"""Prefix caching with an EAGLE pair: the target serves cached features, the draft caches its own exact KV.

Over a conversation (turn 2's prompt extends turn 1's prompt and answer) greedy speculative output is
the same with the cache on and off, and both services hit. The draft's KV at a position depends on the
feature row it ran on, so a block enters its index only when every position in it ran on the target's
exact row: after optimistic commits (rows that are the head's own guesses), rollbacks and rows arriving
late, every block in the draft's index holds the KV a cold prefill with exact rows computes, and a
prefill that the draft's cache serves P positions of takes rows from f_{P-1} on.
"""

from __future__ import annotations

import random

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.errors import InvalidRequestError
from shared.engine.factory import build_feature_draft_engine, build_target_engine
from shared.engine.types import PrefillItem, SpecItem, VerifyItem
from shared.models.tiny import save_tiny, save_tiny_eagle

NUM_TOKENS = 14


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle_prefix")
    target = save_tiny(root / "target", "llama", num_layers=3, seed=0)
    head = save_tiny_eagle(root / "head", target, draft_vocab_size=256)
    return target, head


def pair(dirs, *, prefix_caching=True):
    config = EngineConfig(num_blocks=128, block_size=4, cpu_prepack=False, prefix_caching=prefix_caching)
    target, _ = build_target_engine(dirs[0], device="cpu", engine_config=config, with_tokenizer=False)
    draft = build_feature_draft_engine(dirs[1], target_dir=dirs[0], device="cpu", engine_config=config)
    return target, draft


def turn(target, draft, sid, prompt, chain=3):
    """One request: prefill both, then speculate / verify until NUM_TOKENS; (tokens, drafted trees)."""
    spec = draft.spec
    res = target.prefill([PrefillItem(sid, prompt)], features=spec)[0]
    assert (res.features.start, res.features.end) == (0, len(prompt))  # cached rows included
    draft.prefill([PrefillItem(sid, prompt, features=res.features.rows(0, len(prompt) - 1))])
    out, pending, rows, trees = [res.first_token], [res.first_token], res.features.rows(len(prompt) - 1, len(prompt)), []
    while len(out) < NUM_TOKENS:
        tree = draft.speculate([SpecItem(sid, pending, chain_len=chain, features=rows)])[0]
        trees.append(tree.token_ids)
        v = target.verify([VerifyItem(sid, tree)], features=spec)[0]
        pending, rows = v.tokens, v.features
        out += v.tokens
    target.release([sid])
    draft.release([sid])
    return out, trees


def conversation(target, draft, turns=3):
    rng = random.Random(4)
    history = [rng.randrange(512) for _ in range(11)]
    outs = []
    for t in range(turns):
        out, trees = turn(target, draft, f"turn{t}", history)
        outs.append((out, trees))
        history = history + out + [rng.randrange(512) for _ in range(4)]
    return outs


def test_multi_turn_output_is_the_same_with_the_cache_on_and_off_and_both_hit(dirs):
    warm_t, warm_d = pair(dirs)
    cold_t, cold_d = pair(dirs, prefix_caching=False)
    warm = conversation(warm_t, warm_d)
    cold = conversation(cold_t, cold_d)
    assert [o for o, _ in warm] == [o for o, _ in cold]
    assert [t for _, t in warm] == [t for _, t in cold]  # the draft's state is the same: so are its trees
    t_index, d_index = warm_t.runner.cache.allocator.prefix, warm_d.runner.cache.allocator.prefix
    prompt2 = 11 + NUM_TOKENS + 4
    assert t_index.hits >= 2 * (prompt2 - 8), t_index.hits  # turns 2 and 3 reuse most of the earlier turns
    assert d_index.hits >= 2 * (prompt2 - 12), d_index.hits  # the answers' blocks too, once their rows came
    assert cold_t.runner.cache.allocator.prefix.hits == cold_d.runner.cache.allocator.prefix.hits == 0
    for engine in (warm_t, warm_d):
        engine.runner.check_accounting()
        assert engine.runner.cache.num_free_blocks == engine.runner.cache.num_blocks


def exact_rows(target, spec, tokens):
    """The target's rows f_0 .. f_{len-1} of ``tokens``, from a prefill of its own."""
    res = target.prefill([PrefillItem("\x00rows", tokens)], features=spec)[0]
    target.release(["\x00rows"])
    return res.features


def indexed_blocks(draft, sid):
    """(block index, block id) of the sequence's blocks that are in the draft's prefix index."""
    seq = draft.runner.get(sid)
    prefix = draft.runner.cache.allocator.prefix
    return [(i, b) for i, b in enumerate(seq.block_ids[: len(seq.block_keys)]) if b in prefix]


def block_kv(draft, block_id):
    bs = draft.runner.cache.block_size
    return draft.runner.cache.kv[:, :, block_id * bs : (block_id + 1) * bs].float()  # [L, 2, bs, H, D]


def test_blocks_with_provisional_features_are_never_registered(dirs):
    """Random optimistic commits (the head's rows), rollbacks and late target rows on one sequence: every
    block in the draft's index lies below the exact rows and holds a cold exact prefill's KV."""
    target, cold = pair(dirs, prefix_caching=False)  # the target gives exact rows; cold: a draft without cache
    _, draft = pair(dirs)
    spec = draft.spec
    rng = random.Random(9)
    tokens = [rng.randrange(512) for _ in range(10)]
    draft.prefill([PrefillItem("s", tokens, features=exact_rows(target, spec, tokens).rows(0, 9))])
    known = 9  # rows f_0 .. f_{known-1} sent
    tree = draft.speculate([SpecItem("s", [], chain_len=4)])[0]
    provisional_seen = 0
    for step in range(40):
        seq = draft.runner.get("s")
        op = rng.choice(["chain", "off", "rollback", "rows", "rows"])
        if op == "chain" and len(tree):  # optimistic: commit the drafted chain before the target saw it
            item = SpecItem("s", list(tree.token_ids), chain_len=4)
        elif op == "off":  # optimistic, off the drafted chain: the new position runs on the head's own row
            item = SpecItem("s", [rng.randrange(512)], chain_len=2)
        elif op == "rollback" and seq.num_committed - 1 > known:  # a failed optimistic prefix: roll it back
            back = rng.randrange(1, seq.num_committed - known)
            item = SpecItem("s", [rng.randrange(512)], chain_len=3, rollback=back)
        else:  # the target's rows for everything committed so far, and a new token
            rows = exact_rows(target, spec, seq.token_ids).rows(known, seq.num_committed)
            item = SpecItem("s", [rng.randrange(512)], chain_len=3, features=rows)
        tree = draft.speculate([item])[0]
        if item.features is not None:
            known = item.features.end
        known = min(known, draft.runner.get("s").num_committed - 1)
        st = draft.runner.state["s"]
        provisional_seen += draft.runner.get("s").num_cached > st.num_exact + 1
        bs = draft.runner.cache.block_size
        for i, _ in indexed_blocks(draft, "s"):
            assert (i + 1) * bs <= st.num_exact + 1, (step, i, st.num_exact)  # every position ran on an exact row
        draft.runner.check_accounting()
    assert provisional_seen > 3  # provisional KV was in the cache, and never got indexed
    seq = draft.runner.get("s")
    blocks = indexed_blocks(draft, "s")
    assert len(blocks) >= 4
    end = (blocks[-1][0] + 1) * draft.runner.cache.block_size
    prefix = seq.token_ids[: end + 1]
    cold.prefill([PrefillItem("c", prefix, features=exact_rows(target, spec, prefix).rows(0, end))])
    cold_seq = cold.runner.get("c")
    for i, b in blocks:
        diff = (block_kv(draft, b) - block_kv(cold, cold_seq.block_ids[i])).abs().max()
        assert diff <= 1e-3, (i, float(diff))


def test_a_prefill_the_cache_serves_takes_rows_from_the_first_uncached_position(dirs):
    target, draft = pair(dirs)
    cold_t, cold_d = pair(dirs, prefix_caching=False)
    spec = draft.spec
    rng = random.Random(2)
    prompt = [rng.randrange(512) for _ in range(17)]  # 4 full blocks + 1
    rows = exact_rows(cold_t, spec, prompt)
    draft.prefill([PrefillItem("a", prompt, features=rows.rows(0, 16))])
    longer = prompt + [rng.randrange(512) for _ in range(6)]
    long_rows = exact_rows(cold_t, spec, longer)
    index = draft.runner.cache.allocator.prefix
    hits = index.hits
    # the cache holds positions 0..15: rows from f_15 suffice (starting any later is refused)
    with pytest.raises(InvalidRequestError, match="feature rows 15"):
        draft.prefill([PrefillItem("b", longer, features=long_rows.rows(16, 22))])
    draft.prefill([PrefillItem("b", longer, features=long_rows.rows(15, 23))])
    assert index.hits - hits == 16
    cold_d.prefill([PrefillItem("b", longer, features=long_rows.rows(0, 23))])
    a = draft.speculate([SpecItem("b", [], chain_len=4)])[0]
    b = cold_d.speculate([SpecItem("b", [], chain_len=4)])[0]
    assert a.token_ids == b.token_ids
    torch.testing.assert_close(torch.tensor(a.draft_probs), torch.tensor(b.draft_probs), atol=1e-4, rtol=1e-4)
    # the cache no longer holds them: the same partial rows are refused before anything changes
    draft.release(["a", "b"])
    draft.runner.cache.allocator.drop_cache()
    with pytest.raises(InvalidRequestError, match="feature rows 0"):
        draft.prefill([PrefillItem("c", longer, features=long_rows.rows(15, 22))])
    assert draft.runner.seqs == {}
    draft.runner.check_accounting()
