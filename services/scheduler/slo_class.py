"""The SLO class of a request: a bucket of its TPOT target, named the same in metrics labels and traces.

    slo_class(SLO(tpot_ms=40))  -> "tpot<=50ms"        slo_class(SLO())  -> "none"

Buckets keep the label set small whatever targets clients send.
"""

from __future__ import annotations

from scheduler.request import SLO

# Upper bounds (ms) of the SLO classes: a 40 ms TPOT target is in class "tpot<=50ms".
SLO_CLASS_BOUNDS_MS = (10, 20, 50, 100, 200, 500, 1000)


def slo_class(slo: SLO) -> str:
    if slo.tpot_ms is None:
        return "none"
    for bound in SLO_CLASS_BOUNDS_MS:
        if slo.tpot_ms <= bound:
            return f"tpot<={bound}ms"
    return f"tpot>{SLO_CLASS_BOUNDS_MS[-1]}ms"
