"""The adaptive-length goal check on a hand-made results dict: best fixed in hindsight, pooled and per-run distances."""

import pytest

from bench import adaptive_goals


def _row(mean, runs=None):
    row = {"summary": {"latency_s": {"mean": mean}}}
    if runs:
        row["latency_mean_by_run_s"] = runs
    return row


def _results():
    return {
        "sweep": {
            "rate=0.5": {
                "target-only": _row(2.2, [2.0, 2.4]),
                "tandem-k1": _row(2.0, [1.9, 2.1]),
                "policy:smartspec": _row(2.05, [2.0, 2.1]),
                "policy:nightjar": _row(2.3, [2.3, 2.3]),
            },
            "rate=2": {
                "target-only": _row(4.0, [4.0, 4.0]),
                "tandem-k1": _row(4.4, [4.4, 4.4]),
                "policy:smartspec": _row(4.1, [4.0, 4.2]),
                "policy:nightjar": _row(4.4, [4.4, 4.4]),
            },
        },
        "bursty": {
            "on=2": {
                "target-only": _row(5.0),
                "tandem-k1": _row(5.1),
                "policy:smartspec": _row(4.9),
                "policy:nightjar": _row(5.5),
            }
        },
    }


def test_best_fixed_and_distances_pooled_and_per_run():
    g = adaptive_goals.goals(_results())
    low = g["sweep"]["rate=0.5"]
    assert low["best_fixed"] == "tandem-k1"
    smart = low["policies"]["policy:smartspec"]
    assert smart["vs_best_fixed"] == pytest.approx(0.025)
    assert smart["vs_best_fixed_by_run"] == pytest.approx([2.0 / 1.9 - 1, 0.0])
    assert g["sweep"]["rate=2"]["best_fixed"] == "target-only"
    assert g["highest_load"] == "rate=2"


def test_verdict_per_policy():
    v = adaptive_goals.goals(_results())["verdict"]
    assert v["policy:smartspec"] == {
        "loads_within_5pct_of_best_fixed": "2/2",
        "highest_load_within_5pct_of_target_only": True,
        "bursty_beats_every_fixed": True,
    }
    assert v["policy:nightjar"]["loads_within_5pct_of_best_fixed"] == "0/2"
    assert v["policy:nightjar"]["highest_load_within_5pct_of_target_only"] is False
    assert v["policy:nightjar"]["bursty_beats_every_fixed"] is False


def test_applies_only_with_policies_and_fixed_configurations():
    assert adaptive_goals.applies(_results())
    assert not adaptive_goals.applies({"sweep": {"rate=1": {"target-only": _row(1.0)}}})
    assert not adaptive_goals.applies({"sweep": {"rate=1": {"policy:faser": _row(1.0)}}})
    assert not adaptive_goals.applies({})
