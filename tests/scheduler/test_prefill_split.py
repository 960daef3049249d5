"""The budget split between prefill chunks and speculation (scheduler/policies/prefill_split.py)."""

from scheduler.policies.prefill_split import Decoding, PrefillNeed, split_budget


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
