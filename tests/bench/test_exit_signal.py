"""bench.diagnostics.exit_signal's tally: per layer and K, the shares of rejected (caught) and accepted (false exit) tokens."""

import pytest

from bench.diagnostics.exit_signal import KS, summarise


def test_shares_per_layer_split_by_verdict():
    samples = [(1, [50, 0]), (1, [5, 0]), (0, [200, 3]), (0, [2, 1])]  # (verdict, rank at layer 0, layer 1)
    rows = summarise(samples, num_layers=2)
    assert [r["layer"] for r in rows] == [0, 1]
    assert rows[0]["caught_k10"] == pytest.approx(0.5) and rows[0]["false_exit_k10"] == pytest.approx(0.5)
    assert rows[1]["caught_k1"] == pytest.approx(1.0) and rows[1]["false_exit_k1"] == pytest.approx(0.0)
    assert rows[0]["caught_k100"] == pytest.approx(0.5) and rows[0]["false_exit_k100"] == 0.0
    assert set(KS) == {1, 10, 100}
