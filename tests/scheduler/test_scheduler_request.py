"""Request derivations (TTFT, TPOT, acceptance) and validation."""

from __future__ import annotations

import pytest

from scheduler.request import SLO, Request, RequestState, SpecMode, SpeculationSetting, validate_request
from shared.engine.types import SamplingParams


def test_ttft_tpot_from_hand_built_timestamps():
    r = Request("r", [1, 2], max_new_tokens=10, slo=SLO(tpot_ms=300.0, ttft_ms=400.0))
    assert r.ttft is None and r.tpot is None and r.meets_slo() is None
    r.arrival_time, r.first_token_time = 1.0, 1.5
    r.output_ids = [5]
    r.token_times = [1.5]
    assert r.ttft == pytest.approx(0.5) and r.tpot is None  # n = 1: no TPOT yet
    r.output_ids = [5, 6, 7, 8]
    r.token_times = [1.5, 1.7, 1.7, 2.4]  # two tokens of one step share a timestamp
    assert r.num_generated == 4 and r.num_remaining == 6 and r.num_tokens == 6
    assert r.tpot == pytest.approx((2.4 - 1.5) / 3)
    assert r.meets_slo() is False  # TTFT 500 ms > 400 ms
    r.slo = SLO(tpot_ms=300.0)
    assert r.meets_slo() is True
    r.slo = SLO(tpot_ms=250.0)
    assert r.meets_slo() is False


def test_acceptance_derivations():
    r = Request("r", [1])
    assert r.acceptance_rate is None and r.mean_accepted_len is None
    r.accepted_lens, r.num_drafted_tokens, r.num_accepted_tokens = [2, 0, 3], 9, 5
    assert r.mean_accepted_len == pytest.approx(5 / 3) and r.acceptance_rate == pytest.approx(5 / 9)
    assert r.tokens() == [1] and r.state is RequestState.WAITING and not r.state.done
    assert RequestState.ABORTED.done and RequestState.FAILED.done and RequestState.FINISHED.done


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_ids=[]), "prompt is empty"),
        (dict(prompt_ids=[1, -2]), "non-negative"),
        (dict(id=""), "id must be"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(sampling=SamplingParams(temperature=-1.0)), "temperature"),
        (dict(sampling=SamplingParams(temperature=float("nan"))), "temperature"),
        (dict(sampling=SamplingParams(top_p=0.0)), "top_p"),
        (dict(sampling=SamplingParams(top_p=1.5)), "top_p"),
        (dict(sampling=SamplingParams(temperature=0.7, seed=-1)), "seed"),
        (dict(slo=SLO(tpot_ms=0.0)), "tpot_ms"),
        (dict(slo=SLO(tpot_ms=-5.0)), "tpot_ms"),
        (dict(slo=SLO(tpot_ms=50.0, ttft_ms=float("inf"))), "ttft_ms"),
        (dict(stop_token_ids=[-1]), "stop token"),
        (dict(stop_strings=[""]), "stop strings"),
        (dict(speculation=SpeculationSetting(SpecMode.FIXED, 0)), "FIXED needs k"),
        (dict(speculation=SpeculationSetting(SpecMode.AUTO, 3)), "only meaningful"),
        (dict(priority=1.5), "priority"),
    ],
)
def test_validation_errors(kwargs, message):
    args = dict(id="r", prompt_ids=[1, 2, 3], max_new_tokens=8) | kwargs
    with pytest.raises(ValueError, match=message):
        validate_request(Request(**args))


def test_validation_accepts_good_requests_and_total_limit():
    r = Request("ok", [1, 2, 3], max_new_tokens=8, sampling=SamplingParams(0.8, 0.9, 7), slo=SLO(40.0, 500.0),
                stop_token_ids=[2], stop_strings=["\n\n"], speculation=SpeculationSetting(SpecMode.FIXED, 4))
    validate_request(r)
    validate_request(r, max_total_tokens=11)
    with pytest.raises(ValueError, match="exceeds"):
        validate_request(r, max_total_tokens=10)


def test_tokens_from_is_the_tail_of_tokens_without_copying_the_rest():
    from scheduler.request import Request

    req = Request(id="t", prompt_ids=[1, 2, 3], max_new_tokens=8)
    req.output_ids = [7, 8]
    for start in range(0, 7):
        assert req.tokens_from(start) == req.tokens()[start:]
    assert req.last_token == 8
    assert Request(id="p", prompt_ids=[4, 5], max_new_tokens=1).last_token == 5
