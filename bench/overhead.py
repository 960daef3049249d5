"""Where a configuration's iteration time goes, from the services' spans (bench.spans collects them).

Per scheduler step (the ``commit`` spans carry the step's phase times,
``tandem.step_*_ms``; the model services' server spans carry the engine
thread's time, ``tandem.engine_work_ms``)::

    step window   [commit end − step total, commit end]          scheduler clock ≈ wall clock
    model         Σ engine work of the model-service calls that started in the window
                  (forward passes + acceptance/sampling on the engine thread)
    service       Σ server-span time of those calls − model        (handler, protobuf, engine lock)
    rpc           (prefill + speculate + verify phases) − Σ server-span time   (client stub, wire)
    scheduler     step total − (prefill + speculate + verify)      (admit, plan, select, commit, stream)

    overhead share = 1 − model / step total

Also summed over the steps: the scheduler's phase times (``phase_s``: prefill, speculate,
select, verify, commit, overhead) and the engine work per model service
(``model_s_by_service``), which show where a policy that speculates little still spends
time (draft prefills and catch-up next to the target's work); and the median phase times
per (batch size, longest chain) (``step_ms_by_batch_k``): the step costs a length policy
must predict, as the whole stack pays them (`python -m bench.step_costs results.json`), with
the means of the total and of the other phases beside them (``total_mean``, ``prefill_mean``,
``draft_sync_mean``, ...: medians do not add up, and a step that also prefilled or resynced
the draft shows there).

Only steps that verified something have a commit span, so a step that only
prefilled is not counted; target and draft prefill run concurrently, so their
sum can exceed the prefill phase (parts are clamped at zero). Approximate at
the level of a few tenths of a millisecond, which is what it is for: is the
split into services eating the speedup?
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bench.spans import Span

_CALL_PHASES = ("prefill", "speculate", "verify")


@dataclass
class Step:
    number: int
    start_ns: int
    end_ns: int
    phases_ms: dict[str, float]
    batch_size: int = 0
    k_max: int = 0  # the longest chain (tree depth) any request of the step drafted
    policy: dict[str, float] = field(default_factory=dict)  # the length policy's explain() (tandem.policy.*)

    @property
    def total_s(self) -> float:
        return self.phases_ms["total"] / 1e3


def steps_of(spans: Iterable[Span], trace_ids: set[str]) -> list[Step]:
    """The distinct scheduler steps whose commit spans belong to ``trace_ids``, in order."""
    found: dict[int, Step] = {}
    for s in spans:
        if s.name != "commit" or s.trace_id not in trace_ids or "tandem.step_total_ms" not in s.attributes:
            continue
        number = int(s.attributes["tandem.step"])
        if number in found:
            continue
        phases = {k.removeprefix("tandem.step_").removesuffix("_ms"): float(v) for k, v in s.attributes.items()
                  if k.startswith("tandem.step_") and k.endswith("_ms")}  # fmt: skip
        policy = {k.removeprefix("tandem.policy."): float(v) for k, v in s.attributes.items()
                  if k.startswith("tandem.policy.")}  # fmt: skip
        found[number] = Step(number, s.end_ns - round(phases["total"] * 1e6), s.end_ns, phases,
                             int(s.attributes.get("tandem.batch_size", 0)), int(s.attributes.get("tandem.step_k_max", 0)),
                             policy)  # fmt: skip
    return [found[n] for n in sorted(found)]


def breakdown(spans: list[Span], trace_ids: set[str]) -> dict[str, float | int] | None:
    """Seconds per part over the configuration's steps, and their shares of the step time; None without steps."""
    steps = steps_of(spans, trace_ids)
    if not steps:
        return None
    calls = sorted((s for s in spans if "tandem.engine_work_ms" in s.attributes), key=lambda s: s.start_ns)
    parts = {"model": 0.0, "service": 0.0, "rpc": 0.0, "scheduler": 0.0}
    phases: dict[str, float] = {}  # the scheduler's phase times summed over the steps (what a step spends where)
    model_by_service: dict[str, float] = {}  # engine work per model service (target, draft)
    model_by_call: dict[str, float] = {}  # ... and per service and method ("draft:Prefill")
    total = 0.0
    i = 0
    for step in steps:
        while i < len(calls) and calls[i].start_ns < step.start_ns:
            i += 1
        j = i
        model = served = 0.0
        while j < len(calls) and calls[j].start_ns <= step.end_ns:
            work = float(calls[j].attributes["tandem.engine_work_ms"]) / 1e3
            model += work
            served += calls[j].duration_s
            model_by_service[calls[j].service] = model_by_service.get(calls[j].service, 0.0) + work
            call = f"{calls[j].service}:{calls[j].name.rsplit('/', 1)[-1]}"
            model_by_call[call] = model_by_call.get(call, 0.0) + work
            j += 1
        i = j
        in_calls = sum(step.phases_ms.get(p, 0.0) for p in _CALL_PHASES) / 1e3
        model = min(model, step.total_s)
        parts["model"] += model
        parts["service"] += max(0.0, min(served, in_calls) - model)
        parts["rpc"] += max(0.0, in_calls - served)
        parts["scheduler"] += max(0.0, step.total_s - in_calls)
        total += step.total_s
        for name, ms in step.phases_ms.items():
            if name != "total":
                phases[name] = phases.get(name, 0.0) + ms / 1e3
    out: dict[str, float | int] = {"num_steps": len(steps), "step_s": total, "mean_step_ms": total / len(steps) * 1e3}
    for name, seconds in parts.items():
        out[f"{name}_s"] = seconds
        out[f"{name}_share"] = seconds / total if total else 0.0
    out["overhead_share"] = 1.0 - parts["model"] / total if total else 0.0
    out["phase_s"] = dict(sorted(phases.items()))
    out["model_s_by_service"] = dict(sorted(model_by_service.items()))
    out["model_s_by_call"] = dict(sorted(model_by_call.items()))
    out["step_ms_by_batch_k"] = by_batch_k(steps)
    return out


POLICY_KEYS = ("alpha", "goodput_k0", "goodput_k1", "goodput_k2", "switch_tokens", "switch_requests", "delta_t_ms",
               "gamma_t_ms", "gamma_r_ms", "call_t_ms", "call_d_ms", "delta_d_ms", "gamma_d_ms", "feed_d_ms")


def by_batch_k(steps: list[Step]) -> dict[str, dict[str, float]]:
    """Median phase times (ms) of the steps at each (batch size, longest chain): what a policy's cost model
    should predict, measured through the whole stack (key "b=8,k=1"; n = steps). Where the length policy
    explained its decisions, also the medians of what they rested on (``policy_<key>``: its alpha, its modelled
    goodput of the batch at k = 0..2 in tokens/s, the catch-up it charged the switch), to set beside them."""
    groups: dict[tuple[int, int], list[Step]] = {}
    for step in steps:
        groups.setdefault((step.batch_size, step.k_max), []).append(step)
    out = {}
    for (b, k), group in sorted(groups.items()):
        row: dict[str, float] = {"n": len(group)}
        for phase in ("total", "verify", "speculate"):
            row[phase] = statistics.median(g.phases_ms.get(phase, 0.0) for g in group)
        row["total_mean"] = statistics.fmean(g.phases_ms.get("total", 0.0) for g in group)  # medians do not add up
        for phase in ("draft_sync", "prefill", "select", "commit", "overhead"):  # where a step's time went besides
            if any(phase in g.phases_ms for g in group):
                row[f"{phase}_mean"] = statistics.fmean(g.phases_ms.get(phase, 0.0) for g in group)
        for key in POLICY_KEYS:
            values = [g.policy[key] for g in group if key in g.policy]
            if values:
                row[f"policy_{key}"] = statistics.median(values)
        out[f"b={b},k={k}"] = row
    return out


def trace_ids_by_request(spans: Iterable[Span]) -> dict[str, str]:
    """request id -> trace id, from the scheduler's ``request`` spans."""
    return {
        str(s.attributes["tandem.request_id"]): s.trace_id
        for s in spans
        if s.name == "request" and "tandem.request_id" in s.attributes
    }


def by_config(spans: list[Span], request_config: Mapping[str, str]) -> dict[str, dict | None]:
    """``breakdown`` for each configuration, given which configuration sent each request id."""
    traces = trace_ids_by_request(spans)
    groups: dict[str, set[str]] = {}
    for request_id, config in request_config.items():
        if request_id in traces:
            groups.setdefault(config, set()).add(traces[request_id])
    return {config: breakdown(spans, ids) for config, ids in groups.items()}
