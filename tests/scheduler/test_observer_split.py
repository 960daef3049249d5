"""ObserverSplit: synchronous and deferrable observers, in order, recomputed when the list changes."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.observer_calls import ObserverSplit


@dataclass
class Obs:  # equal by value: the split must still follow identity
    name: str
    deferrable: bool = False


def test_split_follows_the_list_by_identity():
    split = ObserverSplit()
    a, b, c = Obs("a"), Obs("b", True), Obs("c")
    observers = [a, b, c]
    now, later = split(observers)
    assert now == (a, c) and later == (b,) and now[0] is a
    assert split(observers) == (now, later)
    a2 = Obs("a")  # equal to a, but another object
    observers[0] = a2
    assert split(observers)[0][0] is a2
    observers.remove(b)
    assert split(observers) == ((a2, c), ())
    assert split([]) == ((), ())
