"""The draft's share r (FASER §4.4, eq. 11-12): piecewise-linear costs, the chosen r, threads and MPS percentages."""

from __future__ import annotations

import pytest

from shared.profiling.sm_share import (
    DraftLatency,
    ShareCurve,
    TargetLatency,
    choose_share,
    mps_percentages,
    round_time,
    share_grid,
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
