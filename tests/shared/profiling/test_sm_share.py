"""The draft's share r (FASER §4.4, eq. 11-12): piecewise-linear costs, their fit, the chosen r, threads and MPS."""

from __future__ import annotations

import numpy as np
import pytest

from shared.profiling.sm_share import (
    DraftLatency,
    ShareCurve,
    ShareProfile,
    ShareSample,
    TargetLatency,
    auto_share,
    choose_share,
    fit_latency,
    fit_share_curve,
    load_share_profile,
    model_name,
    mps_percentages,
    realisable_grid,
    round_time,
    save_share_profile,
    share_grid,
    share_hardware,
    share_profile_path,
    split_threads,
)

# latency falls steeply with a model's share up to the knee (0.4), slowly after it
CURVE = ShareCurve(a1=3.0, g1=5.0, a2=1.2, g2=0.5, knee=0.4)


def test_curve_is_piecewise_linear_with_its_knee():
    assert CURVE.factor(0.2) == pytest.approx(3.0 - 5.0 * 0.2)
    assert CURVE.factor(0.4) == pytest.approx(1.0)  # the first piece includes the knee
    assert CURVE.factor(0.8) == pytest.approx(1.2 - 0.5 * 0.8)


def test_draft_and_target_follow_eq_11_and_12():
    draft = DraftLatency(alpha=1e-4, beta=2e-3, c=1e-3, curve=CURVE)
    target = TargetLatency(alpha=2e-4, lam=5e-3, c=4e-3, curve=CURVE)
    b, s, r = 4, 3, 0.3
    assert draft.predict(b, s, r) == pytest.approx(CURVE.factor(r) * (1e-4 * b + 2e-3 * s + 1e-3))
    # the target's share is 1 - r: r = 0.3 -> 0.7, past the knee
    assert target.predict(b, s, r) == pytest.approx(CURVE.factor(0.7) * ((2e-4 * b + 5e-3) * s + 4e-3))
    assert draft.predict(b, s, 0.2) > draft.predict(b, s, 0.6)  # more share, faster
    assert target.predict(b, s, 0.2) < target.predict(b, s, 0.6)


def test_choose_share_balances_the_two_sides():
    draft = DraftLatency(beta=1e-3, curve=ShareCurve(a1=1.0, g1=0.9, a2=1.0, g2=0.9))  # ~linear in r
    target = TargetLatency(lam=1e-3, curve=ShareCurve(a1=1.0, g1=0.9, a2=1.0, g2=0.9))
    grid = share_grid(0.01)
    r = choose_share(draft, target, b=1, s_c=2, grid=grid)
    # the draft does 3 tokens' work beside the target's 2: it needs more than half
    assert 0.5 < r < 0.8
    best = round_time(draft, target, 1, 2, r)
    assert all(best <= round_time(draft, target, 1, 2, x) + 1e-12 for x in grid)
    q, p = draft.predict(1, 3, r), target.predict(1, 2, r)
    assert abs(q - p) / max(q, p) < 0.05  # at the balance point


def test_a_cheap_draft_gets_a_small_share():
    draft = DraftLatency(beta=1e-4, curve=CURVE)
    target = TargetLatency(lam=1e-2, c=1e-2, curve=CURVE)
    assert choose_share(draft, target, b=8, s_c=2) <= 0.2


def test_grid_stays_inside_the_unit_interval():
    grid = share_grid(0.05)
    assert grid[0] == pytest.approx(0.05) and grid[-1] == pytest.approx(0.95) and len(grid) == 19


@pytest.mark.parametrize(
    ("share", "cores", "expected"),
    [(0.25, 8, (2, 6)), (0.5, 2, (1, 1)), (0.05, 4, (1, 3)), (0.95, 4, (3, 1)), (0.3, 1, (1, 1)), (0.4, 16, (6, 10))],
)
def test_split_threads(share, cores, expected):
    assert split_threads(share, cores) == expected


def test_mps_percentages():
    assert mps_percentages(0.3) == (30, 70)
    assert mps_percentages(0.001) == (1, 99)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            mps_percentages(bad)
        with pytest.raises(ValueError):
            split_threads(bad, 4)


# ----------------------------------------------------------------------------- fitting eq. 11-12 from measurements

SHARES = [round(0.1 * i, 1) for i in range(1, 11)]
BATCHES, TOKENS = (1, 2, 4, 8), (1, 2, 4)
# continuous at the knee 0.4 (2.9 - 4*0.4 = 1.5 - 0.5*0.4 = 1.3) and 1 at the whole machine: the fit's normalisation
KNEED = ShareCurve(a1=2.9, g1=4.0, a2=1.5, g2=0.5, knee=0.4)
DRAFT = DraftLatency(alpha=2e-4, beta=1.5e-3, c=5e-4, curve=KNEED)
TARGET = TargetLatency(alpha=3e-4, lam=2e-3, c=4e-3, curve=KNEED)


def _samples(model, role: str, shares=SHARES, noise: float = 0.0, seed: int = 0) -> list[ShareSample]:
    """Latency of ``model`` at its own share x (the target's own share is 1 - r)."""
    rng = np.random.default_rng(seed)
    out = []
    for x in shares:
        r = x if role == "draft" else 1.0 - x
        for b in BATCHES:
            for s in TOKENS:
                t = model.predict(b, s, r) * (1.0 + noise * rng.standard_normal())
                out.append(ShareSample(share=x, b=b, s=s, duration_s=t))
    return out


def _assert_curve(got: ShareCurve, want: ShareCurve, rel: float) -> None:
    assert got.knee == pytest.approx(want.knee)
    for field in ("a1", "g1", "a2", "g2"):
        assert getattr(got, field) == pytest.approx(getattr(want, field), rel=rel), field


@pytest.mark.parametrize(("role", "model", "kind"), [("draft", DRAFT, DraftLatency), ("target", TARGET, TargetLatency)])
def test_fit_recovers_the_coefficients_and_knee(role, model, kind):
    fitted, r2 = fit_latency(_samples(model, role), role)
    assert isinstance(fitted, kind) and r2 == pytest.approx(1.0)
    for field in ("alpha", "beta" if role == "draft" else "lam", "c"):
        assert getattr(fitted, field) == pytest.approx(getattr(model, field), rel=1e-6), field
    _assert_curve(fitted.curve, KNEED, rel=1e-6)


def test_fit_with_noise_finds_the_knee_and_predicts_within_the_noise():
    samples = _samples(DRAFT, "draft", noise=0.02, seed=3)
    fitted, r2 = fit_latency(samples, "draft")
    assert fitted.curve.knee == pytest.approx(0.4)
    assert r2 > 0.99
    for x in SHARES:
        assert fitted.predict(4, 2, x) == pytest.approx(DRAFT.predict(4, 2, x), rel=0.05)


def test_two_shares_give_one_line():
    """A 2-core machine: x = 1/2 and 1, no inner share to put a knee on."""
    slow = ShareCurve(a1=1.6, g1=0.6, a2=1.6, g2=0.6)  # f(1/2) = 1.3, f(1) = 1
    fitted, _ = fit_latency(_samples(DRAFT.model_copy(update={"curve": slow}), "draft", shares=[0.5, 1.0]), "draft")
    assert fitted.curve.knee == 1.0
    assert fitted.curve.factor(0.5) == pytest.approx(1.3) and fitted.curve.factor(1.0) == pytest.approx(1.0)


def test_a_straight_curve_gets_no_knee():
    line = ShareCurve(a1=2.0, g1=1.0, a2=2.0, g2=1.0)
    fitted, _ = fit_latency(_samples(DRAFT.model_copy(update={"curve": line}), "draft"), "draft")
    assert fitted.curve.knee == 1.0
    assert fitted.curve.a1 == pytest.approx(2.0) and fitted.curve.g1 == pytest.approx(1.0)


def test_fit_needs_three_sizes():
    samples = [ShareSample(share=1.0, b=1, s=s, duration_s=0.01 * s) for s in (1, 2)]
    with pytest.raises(ValueError):
        fit_latency(samples, "draft")


def test_curve_fit_of_one_share_is_flat():
    assert fit_share_curve([1.0], [1.0]).factor(0.3) == pytest.approx(1.0)


def test_choose_share_on_fitted_curves_minimises_the_pipelined_round():
    draft, _ = fit_latency(_samples(DRAFT, "draft", noise=0.01, seed=1), "draft")
    target, _ = fit_latency(_samples(TARGET, "target", noise=0.01, seed=2), "target")
    grid = share_grid(0.01)
    for b, s_c in [(1, 1), (1, 2), (4, 2), (8, 4)]:
        r = choose_share(draft, target, b, s_c, grid)
        # the round (§4.3): s_c + 1 lookahead tokens drafted beside s_c verified, the slower side sets the pace
        rounds = {x: max(draft.predict(b, s_c + 1, x), target.predict(b, s_c, x)) for x in grid}
        assert rounds[r] == min(rounds.values())
        assert r == min(x for x, t in rounds.items() if t == rounds[r])  # ties: the smaller r


# ----------------------------------------------------------------------------- stored profiles and auto_share


def _store(home, model: str, role: str, fitted, hardware: str) -> None:
    save_share_profile(
        ShareProfile(model=model, role=role, hardware=hardware, device="cpu", dtype="float32", unit="threads",
                     total=4, **{role: fitted}),
        home,
    )  # fmt: skip


def test_auto_share_reads_both_profiles_and_chooses_on_the_machines_grid(tmp_path):
    hardware = share_hardware(cores=4)
    _store(tmp_path, "d", "draft", DRAFT, hardware)
    _store(tmp_path, "t", "target", TARGET, hardware)
    grid = realisable_grid(on_cuda=False, cores=4)
    assert grid == [0.25, 0.5, 0.75]
    choice = auto_share(tmp_path, "d", "t", hardware, grid=grid, b=4, s_c=2)
    assert choice.share == choose_share(DRAFT, TARGET, 4, 2, grid)
    assert choice.round_s == pytest.approx(round_time(DRAFT, TARGET, 4, 2, choice.share))
    assert choice.draft_profile == str(share_profile_path(tmp_path, "d", hardware))
    assert load_share_profile(share_profile_path(tmp_path, "t", hardware)).target == TARGET


def test_auto_share_without_profiles_or_cores(tmp_path):
    hardware = share_hardware(cores=4)
    _store(tmp_path, "d", "draft", DRAFT, hardware)
    with pytest.raises(FileNotFoundError, match="no share profile"):
        auto_share(tmp_path, "d", "t", hardware, grid=[0.5])
    with pytest.raises(FileNotFoundError):  # measured on other hardware
        auto_share(tmp_path, "d", "d", share_hardware(cores=8), grid=[0.5])
    with pytest.raises(ValueError):
        auto_share(tmp_path, "d", "t", hardware, grid=realisable_grid(on_cuda=False, cores=1))


def test_share_profiles_live_apart_from_verify_profiles(tmp_path):
    """The budget loader reads every *.json directly under profiles/<model>/: share profiles sit one level down."""
    path = share_profile_path(tmp_path, "SmolLM2 135M", "cpu X (2 cores)")
    assert path == tmp_path / "profiles" / "smollm2-135m" / "shares" / "cpu-x-2-cores.json"
    assert model_name("/m/smollm2-draft") == "smollm2-draft" and model_name("/m/x.Q8.gguf") == "x.Q8"
