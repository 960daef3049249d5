"""How far the simulator is from the real thing: the same workload, real and simulated, compared cell by cell.

    python -m bench.simulate fidelity            # CPU demo pair -> bench/results/simulate/fidelity/

In one process, back to back, so both share the machine's load (the CPU is shared)::

    profile (before)  `tandem profile`'s measurement of the target's and the draft's forwards (what the
                      policies plan with), and the grid the simulator charges (grid_costs.py)
    real              the real Scheduler, RealClock, the demo pair's engines in-process
                      (LocalTargetWorker / LocalDraftWorker: the services' engines without gRPC),
                      an AcceptanceRecorder on every speculating run -> the acceptance trace
    profile (after)   measured again; the simulator charges the mean of the two grids
    simulated         the same phases on SimTarget / SimDraft, with the real run's rates,
                      SLO baseline and per-request output lengths (greedy: the same for every
                      configuration), acceptance sampled from the trace just recorded, the host
                      time and each forward's excess over the grid fitted on the real run
                      (host_time.py), target and draft sharing one processor (shared_processor.py);
                      and once more on the grids alone, to show what that modelling changes

Cells: batch 1, Poisson at two loads and the bursty trace, under target-only, a fixed
k and one adaptive policy; mean latency, mean TPOT and throughput, real vs simulated.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from pathlib import Path

from bench.configs import Config
from bench.drivers import Job, RealTimer, Run
from bench.simulate.acceptance import replay_key
from bench.simulate.host_time import HostSamples, HostTimeRecorder, timed_workers, with_host
from bench.simulate.recorder import AcceptanceRecorder
from bench.simulate.runner import Phases, SimBackend, SimOptions, SimStack, drive
from bench.simulate.grid_costs import GridProfile, grid_costs, measure_grid, pooled
from scheduler.engine_loop import Scheduler, SchedulerConfig

CONFIGS = ["target-only", "tandem-k3", "policy:smartspec"]
SIM_SEEDS = 5  # simulations per comparison, averaged (acceptance draws)
METRICS = {"latency_s": ("latency_s", "mean"), "tpot_s": ("tpot_s", "mean"), "throughput_tok_s": ("throughput_tok_s",)}


class LocalBackend:
    """The real scheduler over the real engines in this process, a fresh Scheduler per run."""

    def __init__(self, target_engine, draft_engine, stop_token_ids: list[int], config: SchedulerConfig,
                 recorder: AcceptanceRecorder, host: HostSamples | None = None) -> None:  # fmt: skip
        self.host = host or HostSamples()
        self.target, self.draft = timed_workers(target_engine, draft_engine, self.host)  # what the grids miss
        self.stop_token_ids = stop_token_ids
        self.config = config
        self.recorder = recorder

    async def run(self, config: Config, jobs: list[Job], mode: str, concurrency: int) -> Run:
        from services.scheduler.policies import queue_policy, speculation_policy

        key = config.stack
        sched = Scheduler(self.target, self.draft, config=self.config, spec_policy=speculation_policy(key.speculation_policy),
                          queue_policy=queue_policy(key.queue_policy),
                          observers=[self.recorder, HostTimeRecorder(self.host)])  # fmt: skip
        tag = lambda req, job: self.recorder.tag(req.id, job.encoded.item.prompt.kind,  # noqa: E731
                                                 replay_key(job.encoded.prompt_ids, job.max_new_tokens))  # fmt: skip
        return await drive(sched, config, jobs, RealTimer(), mode, concurrency, self.stop_token_ids, tag)


def fidelity_options(**overrides) -> SimOptions:
    base = SimOptions(name="simulate/fidelity", batch1=list(CONFIGS), sweep=list(CONFIGS), num_prompts=6,
                      max_new_tokens=48, sweep_requests=24, sweep_max_new_tokens=32, rate_factors=[1.0, 2.0],
                      bursty=True)  # fmt: skip
    for k, v in overrides.items():
        setattr(base, k, v)
    return base


def _measure(runner, name: str, quick: bool):
    from shared.profiling.measure import measure

    kwargs = {"grid": (1, 2, 4, 8, 16, 32), "context_grid": (4,), "long_context": 256, "repeats": 2} if quick else {}
    return measure(runner, model=name, **kwargs)


def _grid(runner, name: str, quick: bool) -> GridProfile:
    if quick:
        return measure_grid(runner, name, seqs=(1, 2, 4), depths=(1, 2, 4), prefill_tokens=(16, 64), repeats=1)
    return measure_grid(runner, name)


def run_fidelity(out_dir: Path, opts: SimOptions | None = None, pair: str = "demo", quick_profile: bool = False,
                 seed: int = 0, log=print, models=None, seeds: int = SIM_SEEDS) -> dict:  # fmt: skip
    from bench.stack import Models
    from bench.tokens import PromptEncoder
    from shared.engine.factory import build_draft_engine, build_target_engine

    opts = opts or fidelity_options()
    models = models or Models(pair=pair)
    target_dir, draft_dir = models.target_dir(), models.draft_dir()
    encoder = PromptEncoder.for_model(target_dir)
    target, t_loaded = build_target_engine(target_dir, device="cpu", dtype="float32", with_tokenizer=False)
    draft, d_loaded = build_draft_engine(draft_dir, device="cpu", dtype="float32", with_tokenizer=False)
    started, load_before = time.time(), os.getloadavg()

    log("profiling target and draft (before) ...")
    prof = {"before": (_measure(target.runner, t_loaded.name, quick_profile), _measure(draft.runner, d_loaded.name, quick_profile))}
    grids = {"before": (_grid(target.runner, t_loaded.name, quick_profile), _grid(draft.runner, d_loaded.name, quick_profile))}
    recorder = AcceptanceRecorder(draft=d_loaded.name, target=t_loaded.name)
    t0, d0 = prof["before"]  # what the services would read from `tandem profile`: the policies' cost models and B
    sched_config = SchedulerConfig(max_batch_size=64, token_budget=t0.token_budget, cost_model=t0.cost_model,
                                   draft_cost_model=d0.cost_model)  # fmt: skip
    backend = LocalBackend(target, draft, encoder.eos_token_ids, sched_config, recorder)
    real = Phases(opts, backend, encoder, log)
    asyncio.run(real.run())
    real_results = real.results()
    log("profiling target and draft (after) ...")
    prof["after"] = (_measure(target.runner, t_loaded.name, quick_profile), _measure(draft.runner, d_loaded.name, quick_profile))
    grids["after"] = (_grid(target.runner, t_loaded.name, quick_profile), _grid(draft.runner, d_loaded.name, quick_profile))
    load_after = os.getloadavg()

    trace = recorder.trace(source=f"bench.simulate fidelity real runs, {platform.node()}, {time.strftime('%Y-%m-%d')}")
    trace.save(out_dir / "trace-demo.json")
    # what the simulator charges: the measured grids (grid_costs.py), before and after pooled; what the policies
    # plan with: the `tandem profile` cost models the real run's policies had (sched_config)
    t_grid, d_grid = (pooled(grids["before"][i], grids["after"][i]) for i in (0, 1))
    t_grid.save(out_dir / "grid-target.json")
    d_grid.save(out_dir / "grid-draft.json")
    # what the grids miss (host_time.py): engine calls minus their forwards, the scheduler's own step time,
    # and each decode / verify forward's excess over its grid charge in the serving loop
    t_costs, d_costs = grid_costs(t_grid), grid_costs(d_grid)
    host = backend.host.fit(t_costs, d_costs)
    (out_dir / "host-times.json").write_text(host.model_dump_json(indent=1) + "\n")
    lengths = _output_lengths(real)
    sim_opts = fidelity_options(**{**opts.__dict__, "rates": real.rates(), "baseline_tpot_ms": real.baseline_tpot_ms,
                                   "baseline_ttft_s": real.baseline_ttft_s})  # fmt: skip

    def simulate(target_costs, draft_costs, shared: bool) -> tuple[dict, float]:
        """The mean over ``seeds`` simulations (acceptance drawn with each seed): the real run is one greedy
        outcome, a simulation one draw of the trace's acceptance; at batch 1 (6 requests, ~200 steps) one
        draw's tokens per step varies by +-10 %, so one seed would measure the draw, not the model."""
        stack = SimStack(target_costs, draft_costs, trace, sched_config, give_cost_models=False, shared_processor=shared)
        runs, t = [], time.time()
        for s in range(seed, seed + seeds):
            sim = Phases(sim_opts, SimBackend(stack, s, lambda job: lengths.get(_item_key(job), job.max_new_tokens)),
                         encoder, log)  # fmt: skip
            asyncio.run(sim.run())
            runs.append(sim.results())
        return seed_mean(runs), time.time() - t

    forwards_only, _ = simulate(t_costs, d_costs, shared=False)  # the forward grids alone: what the rest adds
    # one CPU: the draft's and the target's overlapping calls share its cores (shared_processor.py)
    sim_results, sim_seconds = simulate(with_host(t_costs, host.target, host.scheduler, forward=host.target_forward),
                                        with_host(d_costs, host.draft, forward=host.draft_forward), shared=True)  # fmt: skip

    out = {
        "name": "simulate/fidelity", "command": "python -m bench.simulate fidelity", "pair": pair,
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": load_after, "uptime": _uptime()},
        "started_unix": started, "duration_s": time.time() - started, "simulation_wall_s": sim_seconds,
        "simulation_seeds": list(range(seed, seed + seeds)),
        "profiles": {w: {"target": p[0].cost_model.model_dump(), "draft": p[1].cost_model.model_dump()} for w, p in prof.items()},
        "grids": {"target": "grid-target.json", "draft": "grid-draft.json"},
        "host_times": host.model_dump(), "cells_forwards_only": compare(real_results, forwards_only),
        "trace": {"path": "trace-demo.json", "mean_accepted_k3": trace.mean_accepted("all", 3)},
        "cells": compare(real_results, sim_results), "real": real_results, "simulated": sim_results,
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(out, indent=1) + "\n")
    (out_dir / "README.md").write_text(readme(out))
    return out


def readme(out: dict) -> str:
    """The folder's README.md: command, machine, date, how many cells are within 10 %, every cell."""
    cells = out["cells"]
    within = [c for c in cells if c["error"] is not None and abs(c["error"]) <= 0.10]
    worst = max((c for c in cells if c["error"] is not None), key=lambda c: abs(c["error"]), default=None)
    m = out["machine"]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(out["started_unix"]))
    lines = [f"# Simulator fidelity: real vs simulated, {date}", "",
             f"Command: `{out['command']}`  ", f"Machine: {m['platform']}, {m['cpu_count']} CPUs, load average "
             f"{m['load_average_before'][0]:.2f} before, {m['load_average_after'][0]:.2f} after  ",
             f"Pair: {out['pair']}; the real Scheduler over the real engines in-process vs the same Scheduler on "
             f"simulated workers (step costs: the forward grids measured before and after, averaged, `grid-*.json`; acceptance: the trace the "
             f"real runs recorded, `trace-demo.json`, mean accepted of a k = 3 chain {out['trace']['mean_accepted_k3']:.2f})  ",
             f"Run: {out['duration_s']:.0f} s, of which simulation {out['simulation_wall_s']:.1f} s; each simulated "
             f"value is the mean of {len(out.get('simulation_seeds', [0]))} simulations (seeds "
             f"{', '.join(map(str, out.get('simulation_seeds', [0])))}: acceptance drawn anew), the last column the "
             f"error of each", "",
             *_host_lines(out),
             f"**{len(within)} of {len(cells)} cells within 10 %**"
             + (f"; the worst: {worst['phase']} {worst['load']} {worst['config']} {worst['metric']} "
                f"{worst['error'] * 100:+.1f} %" if worst else ""), "", table(cells), ""]  # fmt: skip
    return "\n".join(lines)


def _within(cells: list[dict]) -> int:
    return sum(1 for c in cells if c["error"] is not None and abs(c["error"]) <= 0.10)


def _host_lines(out: dict) -> list[str]:
    """The host-time model (host_time.py) and what it changes: cells within 10 % with the forward grids alone."""
    host, plain = out.get("host_times"), out.get("cells_forwards_only")
    if not host:
        return []
    ms = lambda line: f"{line['base_s'] * 1e3:.2f} ms + {line['per_seq_s'] * 1e3:.2f} ms/sequence"  # noqa: E731
    lines = [f"Host time charged on top of the grids (`host-times.json`, fitted on the real runs' calls and steps): "
             f"target call {ms(host['target'])}, draft call {ms(host['draft'])} (per sequence of each forward), "
             f"scheduler step {ms(host['scheduler'])}  "]  # fmt: skip
    if "target_forward" in host:
        lines.append(f"A decode / verify forward in the loop over the grid's charge: target {ms(host['target_forward'])}, "
                     f"draft {ms(host['draft_forward'])}; the draft's and the target's overlapping calls share the "
                     f"CPU (processor sharing)  ")  # fmt: skip
    if plain:
        lines.append(f"With the forward grids alone (no host time, no forward excess, no sharing): {_within(plain)} "
                     f"of {len(plain)} cells within 10 %  ")  # fmt: skip
    return lines + [""]


def _item_key(job: Job) -> str:
    return job.request_id.split("/", 1)[1]  # "<config>/<tag>-i<index>": the same item for every configuration


def _output_lengths(real: Phases) -> dict[str, int]:
    """Output length of each item as target-only produced it (greedy: every configuration's, lossless)."""
    out = {}
    for per_load in real.records.values():
        for config, recs in ((c, rs) for per in per_load.values() for c, rs in per.items()):
            for r in recs:
                if r.trace.num_tokens and (config == "target-only" or _item_key(r.job) not in out):
                    out[_item_key(r.job)] = r.trace.num_tokens
    return out


def _uptime() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return ""


def seed_mean(runs: list[dict]) -> dict:
    """The first run's results with each compared metric replaced by its mean over ``runs``; the per-seed values
    kept under the summary's ``seed_values``."""
    out = json.loads(json.dumps(runs[0]))
    for phase in ("batch1", "sweep", "bursty"):
        loads = {"": out["batch1"]} if phase == "batch1" else out.get(phase, {})
        for load, per in loads.items():
            for config, row in per.items():
                values = {}
                for metric, path in METRICS.items():
                    xs = [_get(_phase_row(r, phase, load, config), path) for r in runs]
                    xs = [x for x in xs if x is not None]
                    if xs:
                        _set(row["summary"], path, sum(xs) / len(xs))
                        values[metric] = xs
                row["summary"]["seed_values"] = values
    return out


def _phase_row(results: dict, phase: str, load: str, config: str) -> dict:
    row = results["batch1"].get(config) if phase == "batch1" else results.get(phase, {}).get(load, {}).get(config)
    return (row or {}).get("summary", {})


def _set(d: dict, path: tuple[str, ...], value) -> None:
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = value


def compare(real: dict, sim: dict) -> list[dict]:
    """One row per (phase, load, configuration, metric): real, simulated, relative error."""
    rows = []
    for phase in ("batch1", "sweep", "bursty"):
        loads = {"batch=1": real["batch1"]} if phase == "batch1" else real.get(phase, {})
        sim_loads = {"batch=1": sim["batch1"]} if phase == "batch1" else sim.get(phase, {})
        for load, per in loads.items():
            for config, row in per.items():
                other = sim_loads.get(load, {}).get(config)
                if other is None:
                    continue
                for metric, path in METRICS.items():
                    r, s = _get(row["summary"], path), _get(other["summary"], path)
                    err = (s - r) / r if r and s is not None else None
                    seeds = other["summary"].get("seed_values", {}).get(metric) or []
                    rows.append({"phase": phase, "load": load, "config": config, "metric": metric, "real": r,
                                 "simulated": s, "error": err,
                                 "error_range": [(min(seeds) - r) / r, (max(seeds) - r) / r] if r and seeds else None})  # fmt: skip
    return rows


def _get(d: dict, path: tuple[str, ...]):
    for k in path:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def table(cells: list[dict]) -> str:
    """The cells as a markdown table (README)."""
    lines = ["| phase | load | configuration | metric | real | simulated (seed mean) | error | error per seed |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cells:
        fmt = (lambda x: f"{x:.1f}") if c["metric"] == "throughput_tok_s" else (lambda x: f"{x * 1e3:.1f} ms")
        err = "" if c["error"] is None else f"{c['error'] * 100:+.1f} %"
        rng = c.get("error_range")
        spread = f"{rng[0] * 100:+.1f} .. {rng[1] * 100:+.1f} %" if rng else ""
        lines.append(f"| {c['phase']} | {c['load']} | {c['config']} | {c['metric']} | {fmt(c['real'])} | "
                     f"{fmt(c['simulated'])} | {err} | {spread} |")  # fmt: skip
    return "\n".join(lines)
