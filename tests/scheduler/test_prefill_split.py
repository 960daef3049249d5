"""The budget split between prefill chunks and speculation (scheduler/policies/prefill_split.py)."""

import pytest

from scheduler.policies.prefill_split import (
    Decoding, PrefillNeed, chunk_cost, pair_cost, split_budget, tokens_within,
)  # fmt: skip


def need(rid, remaining, waited=0.0, ttft=None):
    return PrefillNeed(rid, remaining, waited, ttft)


def test_no_prefill_leaves_the_budget_to_speculation():
    assert split_budget([], [Decoding()], chunk=256, budget=64).spec_budget == 64
    assert split_budget([], [Decoding()], chunk=256).spec_budget is None


def test_one_chunk_at_most_and_the_budget_is_shared():
    s = split_budget([need("a", 2000)], [Decoding()] * 4, chunk=256, budget=512)
    assert s.chunks == {"a": 256} and s.spec_budget == 512 - 256
    s = split_budget([need("a", 2000)], [Decoding()] * 4, chunk=256, budget=100)  # rule 1: R = B - D
    assert s.chunks == {"a": 96} and s.spec_budget == 4


def test_the_last_chunk_is_what_remains():
    assert split_budget([need("a", 40)], [Decoding()], chunk=256).chunks == {"a": 40}


def test_requests_behind_their_tpot_halve_the_prefill_share():
    behind = Decoding(tpot_s=0.2, tpot_slo_s=0.1)
    s = split_budget([need("a", 2000)], [Decoding(), behind], chunk=256, budget=1024)
    assert s.chunks == {"a": 128} and s.spec_budget == 1024 - 128


def test_a_ttft_at_risk_gets_a_full_chunk_even_when_decoders_are_behind():
    behind = Decoding(tpot_s=0.2, tpot_slo_s=0.1)
    risky = need("a", 2000, waited=1.0, ttft=2.0)  # 2000 tokens x 1 ms = 2 s > 0.8 x 1 s left
    s = split_budget([risky], [behind], chunk=256, budget=1024, prefill_token_s=1e-3)
    assert s.chunks == {"a": 256}
    relaxed = need("a", 200, waited=0.0, ttft=10.0)
    assert split_budget([relaxed], [behind], chunk=256, budget=1024, prefill_token_s=1e-3).chunks == {"a": 128}


def test_earliest_ttft_deadline_first_and_progress_for_the_first():
    needs = [need("late", 500, waited=0.0, ttft=5.0), need("soon", 500, waited=0.5, ttft=1.0), need("none", 500)]
    s = split_budget(needs, [Decoding()], chunk=256, budget=200)
    assert list(s.chunks) == ["soon"] and s.chunks["soon"] == 199
    s = split_budget(needs, [Decoding()] * 300, chunk=256, budget=200)  # no room at all: still progress
    assert s.chunks == {"soon": 16} and s.spec_budget == 300


def test_nothing_decodes_every_prefill_gets_its_chunk():
    s = split_budget([need("a", 1000), need("b", 10)], [], chunk=256, budget=None)
    assert s.chunks == {"a": 256, "b": 10} and s.spec_budget is None


# ---------------------------------------------------------------------- equal-cost chunks (rule 1's cost cap)
R = pair_cost(576, 30, 30 * 3_540_096)  # the demo target, SmolLM2-135M: ~3.3e-4


def at(rid, remaining, offset, waited=0.0, ttft=None):
    return PrefillNeed(rid, remaining, waited, ttft, offset=offset)


def grant(offset, *, r=R, decoding=(Decoding(),), chunk=512, **kw):
    return split_budget([at("a", 10_000, offset)], list(decoding), chunk=chunk, pair_cost=r, **kw).chunks.get("a", 0)


def test_the_pair_cost_of_a_shape_is_attention_flops_per_layer_flops():
    assert R == pytest.approx(3.25e-4, rel=0.01)
    assert pair_cost(576, 30, 0) == 0.0  # shape unknown: chunks capped in tokens


@pytest.mark.parametrize("r", [0.0, 1e-5, R, 1e-2, 1.0])
def test_tokens_within_is_the_largest_chunk_the_cost_pays_for(r):
    for cost in (0.5, 1.0, 16.0, 554.7, 3000.0):
        for offset in (0, 1, 100, 1536, 10_000):
            t = tokens_within(cost, offset, r)
            assert chunk_cost(t, offset, r) <= cost * (1 + 1e-9)
            assert chunk_cost(t + 1, offset, r) > cost
    assert tokens_within(0.0, 0, R) == 0 and tokens_within(-1.0, 0, R) == 0


def test_equal_cost_grants_shrink_with_the_offset_and_cost_alike():
    grants = [grant(o) for o in (0, 512, 1024, 1536)]
    assert grants[0] == 512 and grants == sorted(grants, reverse=True) and grants[-1] < 400
    full = chunk_cost(512, 0, R)
    for o, t in zip((0, 512, 1024, 1536), grants):
        assert full - chunk_cost(t + 1, o, R) < 0 <= full - chunk_cost(t, o, R)


def test_without_attention_cost_every_chunk_is_c_tokens():
    assert [grant(o, r=0.0) for o in (0, 512, 5000)] == [512, 512, 512]


def test_a_deep_offset_still_progresses_by_min_chunk():
    assert grant(100_000, r=1.0) == 16
    two = split_budget([at("a", 900, 100_000), at("b", 900, 0)], [Decoding()], chunk=512, pair_cost=1.0)
    assert two.chunks == {"a": 16}  # the first spent the step's cost: the next gets nothing


def test_the_cost_is_shared_in_edf_order():
    needs = [at("late", 5000, 0, ttft=60.0), at("soon", 100, 1900, waited=1.0, ttft=5.0)]
    s = split_budget(needs, [Decoding()], chunk=512, pair_cost=R)
    assert list(s.chunks) == ["soon", "late"] and s.chunks["soon"] == 100  # what remains of its prompt
    left = chunk_cost(512, 0, R) - chunk_cost(100, 1900, R)
    assert s.chunks["late"] == tokens_within(left, 0, R) < 512 - 100  # 100 tokens at 1,900 cost more than at 0
    assert s.spec_budget is None


def test_behind_tpot_halves_the_cost_cap():
    behind = Decoding(tpot_s=0.2, tpot_slo_s=0.1)
    assert grant(0, decoding=[behind]) == 256
    deep = grant(1536, decoding=[behind])
    assert deep < 256 and chunk_cost(deep, 1536, R) <= chunk_cost(256, 0, R)


def test_a_ttft_at_risk_gets_a_full_cost_chunk_at_its_offset():
    behind = Decoding(tpot_s=0.2, tpot_slo_s=0.1)
    risky = at("a", 2000, 1536, waited=1.0, ttft=2.0)
    s = split_budget([risky], [behind], chunk=512, budget=1024, prefill_token_s=1e-3, pair_cost=R)
    assert s.chunks == {"a": grant(1536)} and s.spec_budget == 1024 - grant(1536)


def test_nothing_decodes_chunks_stay_c_tokens_at_any_offset():
    assert grant(1536, decoding=()) == 512
