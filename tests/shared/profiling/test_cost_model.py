"""Fitting the cost model and finding the budget B on synthetic sweeps with known answers (pure numpy)."""

from __future__ import annotations

import random

import pytest

from shared.profiling.cost_model import (
    CostModel,
    Knee,
    Profile,
    Sample,
    find_budget,
    find_profile,
    fit_cost_model,
    load_profile,
    median_sweep,
    profile_path,
    save_profile,
)

GRID = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]


def _roofline(n: int, knee: int = 32, flat_s: float = 0.010, slope_s: float = 0.0005) -> float:
    """A GPU-like forward: memory-bound (flat, a tiny per-token cost) up to the knee, compute-bound after."""
    return flat_s + 1e-6 * n + slope_s * max(0, n - knee)


def test_knee_of_a_roofline_is_found_at_its_breakpoint():
    knee = find_budget([(n, _roofline(n)) for n in GRID])
    assert knee.method == "knee" and knee.budget == 32
    assert knee.slope_after_s == pytest.approx(0.0005 + 1e-6, rel=1e-3)
    assert knee.latency_at_budget_s == pytest.approx(_roofline(32), rel=1e-3)


def test_knee_survives_noise():
    rng = random.Random(0)
    for knee_at in (16, 32, 48):
        sweep = [(n, _roofline(n, knee=knee_at) * (1 + rng.gauss(0, 0.02))) for n in GRID]
        found = find_budget(sweep)
        assert found.method == "knee"
        assert knee_at / 1.5 <= found.budget <= knee_at * 1.5, (knee_at, found)


def test_a_straight_line_has_no_knee_and_b_is_its_ridge():
    # T = a + b*N (every token costs compute, as on a CPU): B = a / b, where a forward costs 2 x T(0)
    a, b = 0.020, 0.001
    knee = find_budget([(n, a + b * n) for n in GRID])
    assert knee.method == "ridge" and knee.budget == 20
    assert knee.slope_before_s == knee.slope_after_s == pytest.approx(b)
    assert knee.latency_at_budget_s == pytest.approx(2 * a, rel=1e-6)


def test_ridge_is_clipped_to_the_measured_range():
    assert find_budget([(n, 0.050 + 1e-7 * n) for n in GRID]).budget == 128  # nearly flat: a / b is far out
    assert find_budget([(n, 0.050) for n in GRID]).budget == 128  # flat: every size is free
    assert find_budget([(n, -0.001 + 0.001 * n) for n in GRID]).budget == 1  # no fixed cost at all


def test_noise_on_a_flat_sweep_is_no_knee():
    # what a tiny model on a busy CPU measures: all noise, no bend worth the name
    rng = random.Random(3)
    for _ in range(20):
        sweep = [(n, 0.002 * (1 + rng.uniform(-0.1, 0.1))) for n in (1, 4, 8, 16, 32)]
        knee = find_budget(sweep)
        assert knee.method == "ridge", sweep


def test_budget_needs_three_points():
    with pytest.raises(ValueError, match="3 sweep points"):
        find_budget([(1, 0.01), (2, 0.02)])


def _samples(model: CostModel, rng: random.Random, noise: float = 0.0) -> list[Sample]:
    out = []
    for ctx in (64, 256, 1024, 2048):
        for n in (1, 4, 16, 64):
            t = model.predict(ctx, n)
            out.append(Sample(duration_s=t * (1 + rng.gauss(0, noise)), num_seqs=4, num_batched_tokens=n,
                              num_context_tokens=ctx))  # fmt: skip
    return out


def test_cost_model_recovers_known_coefficients():
    truth = CostModel(alpha_s=2e-6, gamma_s=3e-4, delta_s=0.012)
    fit = fit_cost_model(_samples(truth, random.Random(0)))
    assert fit.alpha_s == pytest.approx(truth.alpha_s, rel=1e-6)
    assert fit.gamma_s == pytest.approx(truth.gamma_s, rel=1e-6)
    assert fit.delta_s == pytest.approx(truth.delta_s, rel=1e-6)
    assert fit.r2 == pytest.approx(1.0)


def test_cost_model_on_noisy_samples():
    truth = CostModel(alpha_s=2e-6, gamma_s=3e-4, delta_s=0.012)
    fit = fit_cost_model(_samples(truth, random.Random(1), noise=0.03))
    assert fit.alpha_s == pytest.approx(truth.alpha_s, rel=0.3)
    assert fit.gamma_s == pytest.approx(truth.gamma_s, rel=0.3)
    assert fit.delta_s == pytest.approx(truth.delta_s, rel=0.1)
    assert 0.8 < fit.r2 <= 1.0


def test_a_negative_coefficient_is_dropped_and_the_rest_refitted():
    # context does not matter here, and the noise pushes its least-squares coefficient below zero
    rng = random.Random(2)
    samples = []
    for ctx in (64, 2048):
        for n in (1, 8, 32, 64):
            t = 0.010 + 2e-4 * n
            samples.append(Sample(duration_s=t * (1.03 if ctx == 64 else 0.97) + rng.uniform(0, 1e-6), num_seqs=1,
                                  num_batched_tokens=n, num_context_tokens=ctx))  # fmt: skip
    fit = fit_cost_model(samples)
    assert fit.alpha_s == 0.0  # dropped: predictions must not fall as the context grows
    assert fit.gamma_s == pytest.approx(2e-4, rel=0.1)
    assert fit.delta_s == pytest.approx(0.010, rel=0.1)
    assert fit.predict(4096, 8) >= fit.predict(64, 8)


def test_the_verify_mode_cost_is_fitted_from_decodes_beside_verifies():
    """c_t: a forward with drafted tokens costs more than a plain decode of as many tokens (measure.py's pairs)."""
    truth = CostModel(alpha_s=2e-6, gamma_s=3e-4, delta_s=0.012, verify_s=0.008)
    samples = []
    for ctx in (64, 512):
        for seqs in (1, 2, 3, 4):
            for n in (seqs, 2 * seqs, 8 * seqs):  # a plain decode, then verifies of 1 and 7 drafted tokens each
                t = truth.predict(ctx * seqs, n, verify=n > seqs)
                samples.append(Sample(duration_s=t, num_seqs=seqs, num_batched_tokens=n, num_context_tokens=ctx * seqs))
    fit = fit_cost_model(samples)
    assert fit.verify_s == pytest.approx(0.008, rel=1e-6)
    assert fit.gamma_s == pytest.approx(3e-4, rel=1e-6) and fit.delta_s == pytest.approx(0.012, rel=1e-6)
    assert fit.predict(64, 2, verify=True) - fit.predict(64, 2) == pytest.approx(0.008)
    # only verifies (or only decodes): nothing to tell c_t from delta, so it stays 0
    only_verifies = [x for x in samples if x.num_batched_tokens > x.num_seqs]
    assert fit_cost_model(only_verifies).verify_s == 0.0


def test_cost_model_needs_three_samples():
    with pytest.raises(ValueError, match="3 samples"):
        fit_cost_model([Sample(duration_s=0.1, num_seqs=1, num_batched_tokens=1, num_context_tokens=1)] * 2)


def test_median_sweep_groups_by_batched_tokens():
    samples = [Sample(duration_s=d, num_seqs=1, num_batched_tokens=n, num_context_tokens=10)
               for n, d in [(4, 0.3), (1, 0.1), (4, 0.1), (4, 0.2), (1, 0.5)]]  # fmt: skip
    assert median_sweep(samples) == [(1, pytest.approx(0.3)), (4, pytest.approx(0.2))]


def _profile(model: str = "tiny-target", hardware: str = "cpu Xeon (2 threads)", budget: int = 24) -> Profile:
    knee = Knee(budget=budget, method="ridge", slope_before_s=1e-3, slope_after_s=1e-3,
                latency_at_budget_s=0.05, latency_at_one_s=0.026)  # fmt: skip
    return Profile(model=model, hardware=hardware, device="cpu", dtype="float32", token_budget=budget, knee=knee,
                   cost_model=CostModel(gamma_s=1e-3, delta_s=0.025), sweep=[(1, 0.026), (24, 0.05)])  # fmt: skip


def test_profiles_are_stored_per_model_and_hardware_and_read_back(tmp_path):
    path = save_profile(_profile(), tmp_path)
    assert path == profile_path(tmp_path, "tiny-target", "cpu Xeon (2 threads)")
    assert path.relative_to(tmp_path).parts == ("profiles", "tiny-target", "cpu-xeon-2-threads.json")
    back = load_profile(path)
    assert back.token_budget == 24 and back.sweep == [(1, 0.026), (24, 0.05)]
    assert back.cost_model.predict(0, 24) == pytest.approx(0.049)

    other = save_profile(_profile(hardware="NVIDIA H100", budget=128), tmp_path)
    assert find_profile(tmp_path, "tiny-target", "cpu Xeon (2 threads)") == path  # the exact hardware
    assert find_profile(tmp_path, "tiny-target") == other  # else the newest
    assert find_profile(tmp_path, "another-model") is None


def test_a_bf16_profile_is_stored_beside_the_float32_one(tmp_path):
    fp32 = save_profile(_profile(), tmp_path)
    bf16 = save_profile(_profile().model_copy(update={"dtype": "bfloat16"}), tmp_path)
    assert fp32 != bf16 and fp32.is_file() and bf16.is_file()
    assert bf16.name.endswith("-bfloat16.json")
