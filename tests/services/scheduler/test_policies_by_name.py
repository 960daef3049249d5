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


@pytest.mark.parametrize("bad", ["smartspec", "fixed:0", "fixed:x", ""])
def test_unknown_or_malformed_names_say_what_exists(bad):
    with pytest.raises(ValueError, match="fixed"):
        speculation_policy(bad)
