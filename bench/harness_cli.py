"""`python -m bench.harness`: the harness's command line; presets from bench/options.py."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from bench import harness, offload
from bench.configs import BATCH1_PEERS, SWEEP_PEERS
from bench.options import (
    GROUNDED_MAX_PROMPT_TOKENS,
    OFFLOAD_PRESET,
    ORDER_MAX_BATCH_SIZE,
    SLO_PRESET,
    WORKLOADS,
    BenchOptions,
    _given,
    adaptive_options,
    apply_preset,
    faser_options,
    offload_options,
    order_options,
    slo_options,
)
from bench.stack import Models

RESULTS_ROOT = Path(__file__).resolve().parent / "results"

# --- CLI --------------------------------------------------------------------------------------------

app = typer.Typer(add_completion=False)


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _stop_on_sigterm() -> None:
    """SIGTERM (kill, a CI timeout) as Ctrl-C: the stacks' context managers stop their services on the way out
    instead of leaving them running without a parent."""
    import signal

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@app.command()
def main(
    ctx: typer.Context,
    name: str = typer.Option("default", help="Results go to bench/results/<name>/."),
    pair: str = typer.Option("demo", help="Model pair (tandem models list)."),
    home: Path | None = typer.Option(None, help="TANDEM_HOME with the prepared models."),
    target: Path | None = typer.Option(None, help="Target model directory (overrides the pair's)."),
    draft: Path | None = typer.Option(None, help="Draft model directory (overrides the pair's)."),
    dtype: str = typer.Option("float32", help="Weights of both model services: float32, bfloat16 (CPUs with "
                              "native bf16 multiply it through oneDNN-prepacked weights), auto."),
    batch1: str = typer.Option(",".join(BATCH1_PEERS), help="Batch-1 configurations, comma-separated; '' = none."),
    sweep: str = typer.Option(",".join(SWEEP_PEERS), help="Configurations under load; '' = no sweep."),
    prompts: int = typer.Option(6, help="Batch-1 prompts."),
    repeats: int = typer.Option(1, help="Batch-1 passes over the prompts (order rotated each pass)."),
    max_new_tokens: int = typer.Option(64, help="Tokens per batch-1 request."),
    sweep_requests: int = typer.Option(8, help="Requests per rate / concurrency level."),
    sweep_max_new_tokens: int = typer.Option(32, help="Tokens per request under load."),
    rates: str = typer.Option("", help="Request rates (req/s), comma-separated; '' = factors x capacity."),
    rate_factors: str = typer.Option("1,2,4", help="Rates as multiples of the batch-1 request rate."),
    concurrency: str = typer.Option("", help="Closed-loop concurrency levels, comma-separated."),
    closed_factor: int = typer.Option(2, help="Closed loop at concurrency N serves max(sweep-requests, this x N)."),
    sweep_repeats: int = typer.Option(1, min=1, help="Passes over the load points (open and closed loop) and the bursty trace."),
    sample_per_repeat: bool = typer.Option(False, "--sample-per-repeat", help="Each sweep repeat (load points and "
                                           "bursty trace) sends a prompt sample of its own, the same for every "
                                           "configuration within it."),
    interleave: bool = typer.Option(False, help="All stacks up at once, configurations alternating at every load "
                                    "point (on for --adaptive)."),
    length_dist: str = typer.Option("uniform", help="Output-length bounds under load: uniform or log-uniform."),
    workload: str = typer.Option("mixed", help="Prompt set: mixed (chat, code, summarise), chat, or grounded "
                                 "(summarise, rewrite, qa over context, agent transcripts)."),
    draft_model: str | None = typer.Option(None, "--draft-model", help="Every stack's draft instead of the pair's: "
                                           "a model name/directory, ngram[:..] or suffix[:..] (e.g. "
                                           "suffix:global_tokens=0)."),
    seed: int = typer.Option(0),
    threads: int = typer.Option(2, help="torch threads of the HF peers."),
    traces: bool = typer.Option(True, help="Collect spans for the overhead breakdown."),
    stringent_shares: str = typer.Option("", help="Mix phase: shares of stringent requests, e.g. 0.2,0.6,1."),
    share_rate_factor: float = typer.Option(3.0, help="Mix phase rate, x the batch-1 request rate."),
    long_prompts: int = typer.Option(0, min=0, help="Long-prompt arrivals: this many requests with prompts of "
                                     "--long-prompt-tokens tokens join each open-loop load point (class 'long')."),
    long_prompt_tokens: int = typer.Option(2000, min=1, help="Prompt tokens of each long-prompt arrival."),
    long: bool = typer.Option(False, "--long", help="Longer suite: 16 prompts x 2, rates 0.5..4, concurrency 1..8."),
    adaptive: bool = typer.Option(False, "--adaptive", help="Adaptive speculation length (make bench-adaptive): "
                                  "ADAPTIVE_SWEEP, rates 0.5..8 x capacity, one bursty trace; options given refine it."),
    slo: bool = typer.Option(False, "--slo", help="AdaServe's comparison (make bench-slo): SLO_SWEEP configurations, "
                             "60/20/20 mix, rates 1..6 x capacity, stringent shares 0.2..1; options given refine it."),
    faser: bool = typer.Option(False, "--faser", help="FASER's ablation (make bench-faser): serial SD, +pipelining, "
                               "+early exit, all, threads split; batch 1, then 0.5x and 4x capacity; options refine it."),
    order: bool = typer.Option(False, "--order", help="LAPS-SD's comparison (make bench-order): ORDER_SWEEP queue "
                               "policies, 10,30,50 requests at once, 8..256 new tokens (log-uniform); options refine it."),
    elastic: bool = typer.Option(False, "--offload", help="Draft offload under a small KV pool (make bench-offload): "
                                 "offload:on vs offload:off, closed loop at 4 and 12; options refine it."),
    profile: bool = typer.Option(True, help="With a preset (--adaptive, --slo, --order, --faser, --offload): profile "
                                 "the target and the draft first when this machine has no profile of them."),
) -> None:
    _stop_on_sigterm()
    if workload not in WORKLOADS:
        raise typer.BadParameter(f"--workload: one of {', '.join(WORKLOADS)}, got {workload!r}")
    opts = BenchOptions(
        name=name,
        models=Models(pair=pair, home=home, target=target, draft=draft, dtype=dtype),
        batch1=[c for c in batch1.split(",") if c],
        sweep=[c for c in sweep.split(",") if c],
        num_prompts=prompts,
        repeats=repeats,
        max_new_tokens=max_new_tokens,
        sweep_requests=sweep_requests,
        sweep_max_new_tokens=sweep_max_new_tokens,
        rates=_floats(rates),
        rate_factors=_floats(rate_factors),
        concurrency=_ints(concurrency),
        closed_factor=closed_factor,
        sweep_repeats=sweep_repeats,
        sample_per_repeat=sample_per_repeat,
        interleave=interleave,
        length_dist=length_dist,
        seed=seed,
        threads=threads,
        traces=traces,
        stringent_shares=_floats(stringent_shares),
        share_rate_factor=share_rate_factor,
        prompt_mix=dict(WORKLOADS[workload]),
        max_prompt_tokens=GROUNDED_MAX_PROMPT_TOKENS if workload == "grounded" else BenchOptions.max_prompt_tokens,
        stack_draft=draft_model or None,
        long_prompts=long_prompts,
        long_prompt_tokens=long_prompt_tokens,
    )
    if long:
        opts.num_prompts, opts.repeats = max(prompts, 16), max(repeats, 2)
        opts.sweep_requests = max(sweep_requests, 24)
        opts.rate_factors = [0.5, 1.0, 2.0, 3.0, 4.0]
        opts.concurrency = opts.concurrency or [1, 2, 4, 8]
        opts.batch1 = opts.batch1 + [c for c in ("hf-assisted-heuristic",) if c not in opts.batch1 and opts.batch1]
    if slo or adaptive:
        preset = slo_options() if slo else adaptive_options()
        # by name: typer may carry a click of its own, whose ParameterSource is another class
        given = {k for k in ctx.params if getattr(ctx.get_parameter_source(k), "name", "") == "COMMANDLINE"}
        for option, fld in SLO_PRESET.items():
            if option not in given:
                setattr(opts, fld, getattr(preset, fld))
        opts.slo_mix = dict(preset.slo_mix)
        opts.bursty = preset.bursty
        if "interleave" not in given:
            opts.interleave = preset.interleave
    if order:
        given = {k for k in ctx.params if getattr(ctx.get_parameter_source(k), "name", "") == "COMMANDLINE"}
        preset = order_options()
        for fld in ("name", "batch1", "sweep", "rate_factors", "concurrency", "sweep_max_new_tokens", "closed_factor",
                    "length_dist"):
            if fld not in given:
                setattr(opts, fld, getattr(preset, fld))
        os.environ.setdefault("TANDEM_MAX_BATCH_SIZE", ORDER_MAX_BATCH_SIZE)  # the launched services inherit it
    if faser:
        apply_preset(opts, faser_options(), _given(ctx))
    if elastic:
        apply_preset(opts, offload_options(), _given(ctx), OFFLOAD_PRESET)
        pool = offload.pool_env(opts.models.target_dir(), opts.models.draft_dir(), opts.models.dtype)
        for var, value in pool.items():
            os.environ.setdefault(var, value)  # both stacks launch with them; set one to override it
    opts.profile_first = profile and (slo or adaptive or order or faser or elastic)
    results = harness.run_bench(opts)  # looked up at call time: tests replace it
    if elastic:
        offload.write(results, RESULTS_ROOT / opts.name, pool={var: os.environ[var] for var in pool})
    if order:
        from bench import order as order_report

        order_report.write(results, RESULTS_ROOT / opts.name)


