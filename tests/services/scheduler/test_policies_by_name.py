"""Policies by configured name."""

import pytest

from scheduler.policies.speculation import FixedChain, NoSpeculation
from services.scheduler.policies import queue_policy, speculation_policy


def test_names():
    assert isinstance(speculation_policy("none"), NoSpeculation)
    assert isinstance(speculation_policy("OFF"), NoSpeculation)
    assert speculation_policy("fixed").shape.k == 4
    fixed = speculation_policy("fixed:7")
    assert isinstance(fixed, FixedChain) and fixed.shape.k == 7
    assert queue_policy("fcfs").name == "fcfs"


def test_adaptive_length_names():
    assert speculation_policy("smartspec").name == "smartspec"
    assert speculation_policy("smartspec:5").config.max_k == 5
    assert speculation_policy("smartspec-request").config.granularity == "request"
    depth = speculation_policy("smartspec-depth")
    assert depth.config.per_depth and depth.name == "smartspec-depth"  # its own state key
    nofeed = speculation_policy("smartspec-nofeed")
    assert not nofeed.config.charge_feed and nofeed.name == "smartspec-nofeed"
    for name in ("smartspec-noswitch", "smartspec-request-noswitch"):  # the switch's ablations, their own state
        ablation = speculation_policy(name)
        assert not ablation.config.charge_switch and ablation.name == name
    assert speculation_policy("smartspec-request-noswitch").config.granularity == "request"
    reqcost = speculation_policy("smartspec-reqcost")  # the per-request step cost, an extension (off by default)
    assert reqcost.config.cost.per_request and reqcost.name == "smartspec-reqcost"
    assert not speculation_policy("smartspec").config.cost.per_request
    assert speculation_policy("smartspec-conf:0.3").config.confidence_threshold == 0.3
    assert speculation_policy("faser:6").config.max_k == 6
    for bad in ("smartspec:0", "smartspec-conf:2", "faser:x"):
        with pytest.raises(ValueError):
            speculation_policy(bad)


@pytest.mark.parametrize("bad", ["no-such-policy", "fixed:0", "fixed:x", ""])
def test_unknown_or_malformed_names_say_what_exists(bad):
    with pytest.raises(ValueError, match="fixed"):
        speculation_policy(bad)
