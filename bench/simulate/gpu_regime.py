"""The papers' GPU regime, by simulation (SIMULATED: no GPU ran any of this).

    python -m bench.simulate gpu [--only adaserve,smartspec,laps,nightjar]

Step costs: H100 rooflines (roofline.py) of Llama-3-shaped models; acceptance: a trace
recorded from this project's strongest draft (default: the EAGLE-3 head on the demo target,
`tandem simulate trace --draft eagle`). Each experiment is the
paper's comparison with the benches' configuration names::

    adaserve   §6.2: 60/20/20 stringent/moderate/relaxed, target-only, a fixed chain, SpecInfer's
               tree, EqualGreedy, GlobalGreedy, AdaServe; Poisson over rates; 8B+1B on 1 H100 and
               70B+8B on 4 H100 (tensor parallel, like the paper's 70B on 4 A100)
    smartspec  §7: target-only, k = 1, 3, 5 and SmartSpec over load (8B+1B)
    laps       §5.2: FCFS, LAS, LP-SJF, LAPS-SD and LAPS-SD est=1 (bench-order's set), N = 10/30/50 requests at once, 8..256 new tokens
               (log-uniform), batch capped at 4 (bench.harness ORDER_MAX_BATCH_SIZE)
    nightjar   §5.1/§6.3.2: SmartSpec-driven speculation with the draft's memory elastic
               (offload:on) or resident (offload:off), 8B+1B on an H100 capped at 30 % of
               its memory (24 GB, Nightjar's RTX 4090), closed loop from light to KV-bound
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from bench import plots, results_readme
from bench.harness import machine
from bench.configs import OFFLOAD_SPEC
from bench.options import ORDER_SWEEP
from bench.simulate.acceptance import load_trace
from bench.simulate.roofline import checks, roofline
from bench.simulate.runner import Phases, SimBackend, SimOptions, SimStack
from bench.slo import ADASERVE_MIX
from scheduler.engine_loop import SchedulerConfig
from scheduler.policies.elastic_memory import ElasticMemoryConfig, PoolGrowth

PAIRS = {"8b": ("llama-3-8b", "llama-3.2-1b", 1), "70b": ("llama-3-70b", "llama-3-8b", 4)}
BLOCK = 16


def _stack(pair: str, trace, **config) -> SimStack:
    target, draft, tp = PAIRS[pair]
    t, d = roofline("h100", target, tp), roofline("h100", draft, tp)
    reload_s = d.weight_bytes() / (d.gpu.host_link_bytes_s * tp)
    return SimStack(t, d, trace, SchedulerConfig(**config), draft_reload_s=reload_s)


def experiments(trace_path: Path, requests: int) -> dict[str, list[tuple[str, SimStack, SimOptions]]]:
    trace = load_trace(trace_path)
    out: dict[str, list] = {}
    ada = ["target-only", "tandem-k3", "policy:specinfer", "policy:equal_greedy", "policy:global_greedy",
           "policy:adaserve", "policy:adaserve:triage"]  # fmt: skip
    out["adaserve"] = [
        (f"adaserve-{p}", _stack(p, trace, max_batch_size=256),
         SimOptions(name=f"adaserve-{p}", batch1=[], sweep=ada, sweep_requests=requests, sweep_max_new_tokens=128,
                    rate_factors=[2.0, 4.0, 8.0, 16.0, 24.0], slo_mix=dict(ADASERVE_MIX)))
        for p in ("8b", "70b")
    ]  # fmt: skip
    out["smartspec"] = [
        ("smartspec-8b", _stack("8b", trace, max_batch_size=256),
         SimOptions(name="smartspec-8b", batch1=[], sweep=["target-only", "tandem-k1", "tandem-k3", "tandem-k5",
                    "policy:smartspec"], sweep_requests=requests, sweep_max_new_tokens=(32, 256),
                    rate_factors=[1.0, 4.0, 8.0, 16.0, 32.0]))
    ]  # fmt: skip
    out["laps"] = [
        ("laps-8b", _stack("8b", trace, max_batch_size=4),
         SimOptions(name="laps-8b", batch1=[], sweep=list(ORDER_SWEEP), rate_factors=[],
                    concurrency=[10, 30, 50], closed_factor=1, sweep_requests=1, sweep_max_new_tokens=(8, 256),
                    length_dist="log-uniform"))
    ]  # fmt: skip
    t, d = roofline("h100", "llama-3-8b"), roofline("h100", "llama-3.2-1b")
    fraction = 0.3
    cap = t.kv_capacity_tokens(fraction, other_weights=d.weight_bytes())
    extra_blocks = int(d.weight_bytes() // t.model.kv_bytes_per_token()) // BLOCK
    growth = PoolGrowth(base_blocks=cap // BLOCK, extra_blocks=extra_blocks, block_size=BLOCK)
    out["nightjar"] = [
        ("nightjar-8b", _stack("8b", trace, max_batch_size=256, max_tokens_in_flight=cap, pool_growth=growth),
         SimOptions(name="nightjar-8b", batch1=[], sweep=["offload:off", "offload:on"], rate_factors=[],
                    concurrency=[8, 32, 64, 128], closed_factor=2, sweep_requests=requests,
                    sweep_max_new_tokens=(64, 512), max_prompt_tokens=768))
    ]  # fmt: skip
    return out


def _offload_config(config, cfg: SchedulerConfig) -> SchedulerConfig:
    """offload:on gets Nightjar's trigger (bench.configs OFFLOAD_SPEC); offload:off keeps the draft resident."""
    key = config.stack
    if key is None or key.draft_offload in (None, "off"):
        return cfg.model_copy(update={"draft_memory": None})
    values = dict(part.split("=") for part in OFFLOAD_SPEC.split(","))
    memory = ElasticMemoryConfig(low_free=float(values["low"]), high_free=float(values["high"]),
                                 persist_steps=int(values["persist"]))  # fmt: skip
    return cfg.model_copy(update={"draft_memory": memory})


async def _run_one(stack: SimStack, opts: SimOptions, seed: int) -> dict:
    backend = SimBackend(stack, seed, per_config=_offload_config)
    from bench.stack import Models
    from bench.tokens import PromptEncoder

    phases = Phases(opts, backend, PromptEncoder.for_model(Models().target_dir(), opts.max_prompt_tokens), log=lambda _: None)
    await phases.run()
    res = phases.results(simulated=True, pair=f"SIMULATED {stack.target.name} + {stack.draft.name}",
                         target=stack.target.name, draft=stack.draft.name)  # fmt: skip
    if res.get("baseline_tpot_ms") is None:
        res["baseline_tpot_ms"] = 0.0
    return res


def run_all(out_dir: Path, trace_path: Path, only: list[str], requests: int, seed: int = 0) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict = {"simulated": True, "trace": str(trace_path), "roofline_checks": [c.__dict__ | {"ratio": c.ratio}
                     for c in checks()], "experiments": {}}  # fmt: skip
    for group, runs in experiments(trace_path, requests).items():
        if only and group not in only:
            continue
        for name, stack, opts in runs:
            t = time.time()
            res = asyncio.run(_run_one(stack, opts, seed))
            res |= {"simulation_wall_s": time.time() - t, "started_unix": t, "duration_s": time.time() - t,
                    "command": f"python -m bench.simulate gpu --trace {trace_path.name} (SIMULATED: {name})",
                    "machine": machine(0)}  # fmt: skip
            sub = out_dir / name
            sub.mkdir(exist_ok=True)
            res["plots"] = [p.name for p in plots.all_plots(res, sub)]
            (sub / "results.json").write_text(json.dumps(res, indent=1) + "\n")
            results_readme.write(sub)
            summary["experiments"][name] = _headline(res)
            print(f"{name}: {res['simulation_wall_s']:.1f} s")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _headline(res: dict) -> dict:
    """Per phase, load and configuration: mean latency, TPOT, throughput, goodput, attainment."""
    out = {}
    for phase in ("sweep", "closed"):
        for load, per in (res.get(phase) or {}).items():
            for config, row in per.items():
                s = row["summary"]
                out.setdefault(load, {})[config] = {
                    "latency_mean_s": s["latency_s"]["mean"], "tpot_mean_s": s["tpot_s"]["mean"],
                    "throughput_tok_s": s["throughput_tok_s"], "goodput_tok_s": s["goodput_tok_s"],
                    "attainment": s["attainment"], "mean_accepted_length": s["mean_accepted_length"],
                }  # fmt: skip
    return out

