"""A run's latency ratio with the machine's drift taken out, from the step times each run measured.

    shared_shape(runs, ref_runs)   the step shape ("b=4,k=3") both configurations ran most: the gauge
    adjusted_ratios(runs, ref)     per repeat: (latency / ref latency) x (ref gauge / own gauge)

Configurations measured one after another on a shared machine meet different machine speeds: on the
2-core bench machines FCFS's mean latency on one sample moved 26 -> 37 -> 31 s over three repeats
(order-grounded, 2026-11-27), its TPOT 85 -> 120 -> 105 ms, while the ratios it is the reference of
are asked to resolve 25 %. Each run's own median verify time at a step shape both configurations run
(the same batch size and chain, so the same work) measures that speed: a run whose verify of that
shape took 10 % longer ran on a machine 10 % slower, and its latency is scaled back by it. An order
policy does not change what a step of a given shape computes, only which requests fill it (their
contexts differ; on these models the linears dominate), so the gauge reads the machine, not the
policy. This is a diagnostic beside the measured ratio, which stays the verdict.
"""

from __future__ import annotations

from collections.abc import Sequence


def _steps(runs: Sequence[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for run in runs:
        for shape, row in (run.get("step_ms_by_batch_k") or {}).items():
            counts[shape] = counts.get(shape, 0) + int(row.get("n", 0))
    return counts


def shared_shape(runs: Sequence[dict], ref_runs: Sequence[dict]) -> str | None:
    """The shape with the most steps over both configurations' runs among those every run measured."""
    every = [set((r.get("step_ms_by_batch_k") or {})) for r in [*runs, *ref_runs]]
    if not every or not all(every):
        return None
    common = set.intersection(*every)
    counts = {s: n for s, n in _steps([*runs, *ref_runs]).items() if s in common}
    return max(counts, key=counts.__getitem__) if counts else None


def gauge_ms(run: dict, shape: str) -> float | None:
    row = (run.get("step_ms_by_batch_k") or {}).get(shape) or {}
    return row.get("verify") or None


def adjusted_ratios(runs: Sequence[dict], ref_runs: Sequence[dict]) -> list[float] | None:
    """Per repeat (matched by ``repeat``): latency ratio to the reference, scaled by the machine speed each run
    met; None where a run lacks step times (results before 2026-11-27, or no spans)."""
    shape = shared_shape(runs, ref_runs)
    if shape is None:
        return None
    ref = {r["repeat"]: r for r in ref_runs}
    out = []
    for run in runs:
        other = ref.get(run["repeat"])
        if other is None:
            continue
        mine, theirs = gauge_ms(run, shape), gauge_ms(other, shape)
        if not (mine and theirs and run.get("latency_mean_s") and other.get("latency_mean_s")):
            return None
        out.append(run["latency_mean_s"] / other["latency_mean_s"] * theirs / mine)
    return out or None
