"""`tandem simulate` / `python -m bench.simulate`: run, fidelity, gpu.

    tandem simulate run --target-profile T.json [--draft-profile D.json] --trace trace.json --sweep ...
    tandem simulate run --gpu h100 --target-model llama-3-8b --draft-model llama-3.2-1b --trace ...
    tandem simulate fidelity          real vs simulated on the CPU demo pair (bench/results/simulate/fidelity/)
    tandem simulate gpu               the papers' GPU regime by simulation (bench/results/simulate/gpu/)
    tandem simulate trace --draft D   record an acceptance trace (bench/results/simulate/traces/)

Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

RESULTS_ROOT = Path(__file__).resolve().parents[1] / "results"
app = typer.Typer(add_completion=False, help="Serving on a virtual clock: the real scheduler, simulated workers.")


@app.command()
def run(
    name: str = typer.Option("simulate-run", help="Results go to bench/results/<name>/."),
    target_profile: Path | None = typer.Option(None, help="Target profile JSON (`tandem profile`, or the GPU kit's)."),
    draft_profile: Path | None = typer.Option(None, help="Draft profile JSON (`tandem profile --draft`)."),
    gpu: str | None = typer.Option(None, help="Roofline instead of a profile: a100, h100, h200, rtx4090, l20."),
    target_model: str = typer.Option("llama-3-8b", help="Roofline target shape (bench.simulate.roofline.MODELS)."),
    draft_model: str | None = typer.Option(None, help="Roofline draft shape; none: a model-free draft."),
    tp: int = typer.Option(1, help="Roofline tensor parallelism."),
    trace: Path = typer.Option(..., help="Acceptance trace JSON (bench.simulate.recorder)."),
    batch1: str = typer.Option("target-only,tandem-k3", help="Batch-1 configurations ('' = none)."),
    sweep: str = typer.Option("target-only,tandem-k3", help="Configurations under load."),
    rates: str = typer.Option("", help="Poisson rates (req/s); '' = rate factors x batch-1 capacity."),
    rate_factors: str = typer.Option("1,2,4", help="Rates as multiples of the batch-1 request rate."),
    requests: int = typer.Option(24, help="Requests per load point."),
    max_new_tokens: int = typer.Option(32, help="Output bound per request under load."),
    bursty: bool = typer.Option(False, help="Also the on/off bursty trace."),
    max_batch_size: int = typer.Option(64),
    seed: int = typer.Option(0),
) -> None:
    """Simulate the benches' phases for the given configurations; results.json + PNGs like bench.harness."""
    import asyncio

    import sys
    import time

    from bench import plots, results_readme
    from bench.harness import machine
    from bench.simulate.acceptance import load_trace
    from bench.simulate.roofline import roofline
    from bench.simulate.runner import Phases, SimBackend, SimOptions, SimStack
    from bench.simulate.step_costs import ConstantCosts, load_profile_costs
    from bench.stack import Models
    from bench.tokens import PromptEncoder
    from scheduler.engine_loop import SchedulerConfig

    if gpu:
        target = roofline(gpu, target_model, tp)
        draft = roofline(gpu, draft_model, tp) if draft_model else ConstantCosts("model-free", 0.0005)
    elif target_profile:
        target = load_profile_costs(target_profile)
        draft = load_profile_costs(draft_profile) if draft_profile else ConstantCosts("model-free", 0.0005)
    else:
        raise typer.BadParameter("give --target-profile or --gpu")
    floats = lambda s: [float(x) for x in s.split(",") if x.strip()]  # noqa: E731
    opts = SimOptions(name=name, batch1=[c for c in batch1.split(",") if c], sweep=[c for c in sweep.split(",") if c],
                      rates=floats(rates), rate_factors=floats(rate_factors), sweep_requests=requests,
                      sweep_max_new_tokens=max_new_tokens, bursty=bursty, seed=seed)  # fmt: skip
    stack = SimStack(target, draft, load_trace(trace), SchedulerConfig(max_batch_size=max_batch_size))
    phases = Phases(opts, SimBackend(stack, seed), PromptEncoder.for_model(Models().target_dir()))
    started = time.time()
    asyncio.run(phases.run())
    results = phases.results(simulated=True, pair=f"simulated: {target.name}", target=target.name, draft=draft.name)
    results |= {"command": "python -m bench.simulate " + " ".join(sys.argv[1:]), "started_unix": started,
                "duration_s": time.time() - started, "machine": machine(0)}  # fmt: skip
    out = RESULTS_ROOT / name
    out.mkdir(parents=True, exist_ok=True)
    results["plots"] = [p.name for p in plots.all_plots(results, out)]
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    results_readme.write(out)
    typer.echo(f"simulated in {results['duration_s']:.1f} s; results in {out}")


@app.command()
def fidelity(
    name: str = typer.Option("simulate/fidelity", help="Results go to bench/results/<name>/."),
    quick: bool = typer.Option(False, help="A smoke run: one prompt, three requests per load, a quick profile."),
    seed: int = typer.Option(0),
    seeds: int = typer.Option(5, min=1, help="Simulations per comparison (seed, seed + 1, ...), averaged."),
) -> None:
    """Real vs simulated on the CPU demo pair, back to back in this process (bench.simulate.fidelity)."""
    from bench.simulate.fidelity import fidelity_options, run_fidelity, table

    opts = fidelity_options(name=name)
    if quick:
        opts = fidelity_options(name=name, num_prompts=1, max_new_tokens=8, sweep_requests=3, sweep_max_new_tokens=8)
    out = run_fidelity(RESULTS_ROOT / name, opts, quick_profile=quick, seed=seed, seeds=seeds)
    typer.echo(table(out["cells"]))


@app.command()
def gpu(
    name: str = typer.Option("simulate/gpu", help="Results go to bench/results/<name>/."),
    trace: Path = typer.Option(RESULTS_ROOT / "simulate/traces" / "trace-eagle.json",
                               help="Acceptance trace (default: the EAGLE-3 head's, `tandem simulate trace --draft eagle`)."),
    only: str = typer.Option("", help="Comma-separated experiments (adaserve, smartspec, laps, nightjar); '' = all."),
    requests: int = typer.Option(200, help="Requests per load point."),
) -> None:
    """The papers' GPU regime, simulated on an H100 roofline (bench.simulate.gpu_regime)."""
    from bench.simulate.gpu_regime import run_all

    run_all(RESULTS_ROOT / name, trace, [x for x in only.split(",") if x], requests)


@app.command()
def trace(
    draft: str = typer.Option("demo", help="demo (the pair's draft), ngram, suffix or eagle."),
    prompts: int = typer.Option(3, help="Prompts per kind."),
    k: int = typer.Option(4, help="Chain length drafted per step."),
    max_new_tokens: int = typer.Option(64),
    out: Path = typer.Option(RESULTS_ROOT / "simulate/traces", help="Folder of trace-<draft>.json."),
) -> None:
    """Record an acceptance trace from real in-process runs of one draft on the demo target (bench.simulate.traces)."""
    from bench.simulate.traces import record_trace

    typer.echo(f"trace in {record_trace(draft, out, prompts, k, max_new_tokens)}")
