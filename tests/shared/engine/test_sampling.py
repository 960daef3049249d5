"""Target probabilities, draft distributions, seeded sampling, validation."""

import math

import pytest
import torch
from scipy.stats import chisquare

from shared.engine.errors import InvalidRequestError
from shared.engine.sampling import (
    dense_probs,
    draft_dist,
    make_generator,
    probs_from_logits,
    sample,
    sample_sparse,
    validate_sampling,
)
from shared.engine.types import SamplingParams, SparseDist

ALPHA = 1e-3  # chi-square significance level; seeds are fixed, so each test is deterministic


# ---- validation -------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [SamplingParams(), SamplingParams(temperature=0.7, top_p=0.9, seed=0), SamplingParams(1, 1, 2**64 - 1)],
)
def test_valid_params_pass(params):
    validate_sampling(params)


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(temperature=math.nan), "temperature"),
        (SamplingParams(temperature=math.inf), "temperature"),
        (SamplingParams(temperature="hot"), "temperature"),
        (SamplingParams(temperature=1.0, top_p=0.0), "top_p"),
        (SamplingParams(temperature=1.0, top_p=-0.5), "top_p"),
        (SamplingParams(temperature=1.0, top_p=1.5), "top_p"),
        (SamplingParams(temperature=1.0, top_p=math.nan), "top_p"),
        (SamplingParams(temperature=1.0, top_p=None), "top_p"),
        (SamplingParams(seed=-1), "seed"),
        (SamplingParams(seed=2**64), "seed"),
        (SamplingParams(seed=1.5), "seed"),
        (SamplingParams(seed=True), "seed"),
    ],
)
def test_invalid_params_raise(params, message):
    with pytest.raises(InvalidRequestError, match=message):
        validate_sampling(params)


def test_probs_from_logits_validates():
    with pytest.raises(InvalidRequestError):
        probs_from_logits(torch.zeros(1, 4), SamplingParams(temperature=-1.0))


# ---- probs_from_logits -------------------------------------------------------


def test_temperature_one_is_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])  # [2, 4]
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0))
    assert probs.dtype == torch.float32 and probs.shape == (2, 4)
    torch.testing.assert_close(probs, torch.softmax(logits, dim=-1))
    torch.testing.assert_close(probs[1], torch.full((4,), 0.25))


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0]])
    torch.testing.assert_close(
        probs_from_logits(logits, SamplingParams(temperature=0.5)), torch.softmax(2 * logits, dim=-1)
    )
    # high temperature flattens, low sharpens
    hot = probs_from_logits(logits, SamplingParams(temperature=10.0))[0]
    cold = probs_from_logits(logits, SamplingParams(temperature=0.1))[0]
    assert hot.max() < 0.35 and cold.max() > 0.99


def test_greedy_is_one_hot_argmax_first_on_ties():
    logits = torch.tensor([[0.0, 5.0, 1.0], [2.0, 2.0, 1.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=0.0, top_p=0.5))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_top_p_by_hand():
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = p.log()[None]  # [1, 4]
    # sorted: 0.4 (ahead 0), 0.3 (ahead 0.4), 0.2 (ahead 0.7), 0.1 (ahead 0.9)
    cases = {
        0.3: [0.0, 1.0, 0.0, 0.0],  # 0.4 alone reaches 0.3
        0.5: [0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],  # 0.4 < 0.5: the next token (0.3) joins
        0.69: [0.0, 0.4 / 0.7, 0.0, 0.3 / 0.7],  # 0.4 + 0.3 reaches 0.69 (0.7 itself is a rounding coin-flip)
        0.85: [0.0, 0.4 / 0.9, 0.2 / 0.9, 0.3 / 0.9],
        1.0: [0.1, 0.4, 0.2, 0.3],
    }
    for top_p, expected in cases.items():
        got = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))[0]
        torch.testing.assert_close(got, torch.tensor(expected), msg=f"top_p={top_p}")


def test_tiny_top_p_keeps_the_top_token():
    logits = torch.tensor([[0.0, 1.0, 0.5], [3.0, 1.0, 2.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=1e-9))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_rows_are_independent_and_vectorised():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=gen) * 3  # [6, 50]
    params = SamplingParams(temperature=0.8, top_p=0.9)
    batched = probs_from_logits(logits, params)
    for row in range(6):
        torch.testing.assert_close(batched[row], probs_from_logits(logits[row : row + 1], params)[0])
    torch.testing.assert_close(batched.sum(-1), torch.ones(6))


def test_low_precision_and_masked_logits():
    logits = torch.tensor([[1.0, -math.inf, 2.0, 0.0]], dtype=torch.bfloat16)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0))
    assert probs.dtype == torch.float32 and probs[0, 1] == 0.0
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0))


# ---- generators and sampling ---------------------------------------------------


def test_seeded_generators_reproduce():
    probs = torch.full((1000,), 1e-3)
    gen_a = make_generator(42)
    draws_a = [sample(probs, gen_a) for _ in range(20)]
    gen_b = make_generator(42)
    draws_b = [sample(probs, gen_b) for _ in range(20)]
    gen_c = make_generator(43)
    draws_c = [sample(probs, gen_c) for _ in range(20)]
    assert draws_a == draws_b
    assert draws_a != draws_c


def test_unseeded_generators_differ():
    probs = torch.full((1000,), 1e-3)
    gen_a, gen_b = make_generator(None), make_generator(None)
    assert [sample(probs, gen_a) for _ in range(20)] != [sample(probs, gen_b) for _ in range(20)]
    assert gen_a.device == torch.device("cpu")


def test_sample_never_draws_zero_probability():
    gen = make_generator(0)
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5])
    assert {sample(probs, gen) for _ in range(200)} == {1, 3}
    assert sample(torch.tensor([0.0, 0.0, 1.0]), gen) == 2


def test_sample_matches_distribution():
    gen = make_generator(1)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 20_000
    counts = torch.bincount(torch.tensor([sample(probs, gen) for _ in range(n)]), minlength=4)
    assert chisquare(counts.numpy(), (probs * n).numpy()).pvalue > ALPHA


# ---- draft distributions ---------------------------------------------------------


def test_draft_dist_top_k_renormalises():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    dist = draft_dist(logits, SamplingParams(temperature=1.0), top_k=3)
    full = torch.softmax(logits, dim=-1)
    assert dist.token_ids.tolist() == [1, 2, 3] and dist.token_ids.dtype == torch.int64
    torch.testing.assert_close(dist.probs, full[[1, 2, 3]] / full[[1, 2, 3]].sum())
    assert dist.probs.dtype == torch.float32


def test_draft_dist_applies_temperature_and_top_p_before_top_k():
    logits = torch.tensor([0.1, 0.4, 0.2, 0.3]).log()
    dist = draft_dist(logits, SamplingParams(temperature=1.0, top_p=0.5), top_k=64)
    assert dist.token_ids.tolist() == [1, 3]  # top-p cut to {1, 3}, fewer than k; zeros dropped
    torch.testing.assert_close(dist.probs, torch.tensor([0.4 / 0.7, 0.3 / 0.7]))
    cold = draft_dist(logits, SamplingParams(temperature=0.5), top_k=2)
    sharpened = torch.tensor([0.16, 0.09])  # p^2 for tokens 1, 3
    torch.testing.assert_close(cold.probs, sharpened / sharpened.sum())


def test_greedy_draft_dist_is_one_token():
    dist = draft_dist(torch.tensor([0.0, 2.0, 1.0]), SamplingParams(temperature=0.0))
    assert dist.token_ids.tolist() == [1] and dist.probs.tolist() == [1.0]


def test_draft_dist_top_k_larger_than_vocab_and_invalid_k():
    dist = draft_dist(torch.zeros(3), SamplingParams(temperature=1.0), top_k=64)
    assert sorted(dist.token_ids.tolist()) == [0, 1, 2]
    with pytest.raises(InvalidRequestError):
        draft_dist(torch.zeros(3), SamplingParams(temperature=1.0), top_k=0)


def test_sample_sparse_matches_distribution_and_seed():
    dist = SparseDist(token_ids=torch.tensor([7, 2, 9]), probs=torch.tensor([0.5, 0.3, 0.2]))
    gen = make_generator(3)
    n = 20_000
    draws = [sample_sparse(dist, gen) for _ in range(n)]
    assert set(draws) <= {7, 2, 9}
    counts = [draws.count(t) for t in (7, 2, 9)]
    assert chisquare(counts, [0.5 * n, 0.3 * n, 0.2 * n]).pvalue > ALPHA
    gen_a, gen_b = make_generator(5), make_generator(5)
    assert [sample_sparse(dist, gen_a) for _ in range(30)] == [sample_sparse(dist, gen_b) for _ in range(30)]


def test_dense_probs():
    dist = SparseDist(token_ids=torch.tensor([3, 0]), probs=torch.tensor([0.75, 0.25]))
    assert dense_probs(dist, 5).tolist() == [0.25, 0.0, 0.0, 0.75, 0.0]
