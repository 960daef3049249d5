"""What one harness run does (BenchOptions) and the presets of the `make bench-*` targets.

Each preset is a BenchOptions for one paper's evaluation; the CLI (bench/harness.py) applies a
preset's values to the options the command line did not give (``apply_preset``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import typer

from bench import offload
from bench.configs import BATCH1_PEERS, SWEEP_PEERS
from bench.prompts import GROUNDED
from bench.slo import ADASERVE_MIX
from bench.stack import Models

DEFAULT_PROMPT_MIX = {"chat": 0.5, "code": 0.25, "summarize": 0.25}
# --workload: the prompt mixes a policy bench can run on (bench/prompts.py kinds)
WORKLOADS = {
    "mixed": dict(DEFAULT_PROMPT_MIX),
    "chat": {"chat": 1.0},
    "grounded": {kind: 1.0 for kind in GROUNDED},  # the answer is largely in the prompt
}
GROUNDED_MAX_PROMPT_TOKENS = 1536  # grounded prompts carry a passage, a file or a transcript
# AdaServe's comparison (§6.2): no speculation, a fixed chain, the fixed SpecInfer tree, the two
# budgeted greedy baselines, and AdaServe itself, as printed and with this project's options for hardware
# where a verified token and a drafted beam level are not free (marginal, depth, paced) and for overload
# (triage): scheduler/policies/adaserve.py.
SLO_SWEEP = ("target-only", "tandem-k3", "policy:specinfer", "policy:equal_greedy", "policy:global_greedy",
             "policy:adaserve", "policy:adaserve:marginal+depth+paced+triage")  # fmt: skip
SLO_STRINGENT_SHARES = (0.2, 0.4, 0.6, 0.8, 1.0)
# Adaptive speculation length (issues 6, 20): fixed k in {0, 1, 2, 3, 5, 7} against the learning policies.
ADAPTIVE_SWEEP = ("target-only", "tandem-k1", "tandem-k2", "tandem-k3", "tandem-k5", "tandem-k7", "policy:smartspec",
                  "policy:smartspec-request", "policy:faser")  # fmt: skip


@dataclass
class BenchOptions:
    """One harness run. Defaults: the short suite (`make bench`)."""

    name: str = "default"
    models: Models = field(default_factory=Models)
    batch1: list[str] = field(default_factory=lambda: list(BATCH1_PEERS))
    sweep: list[str] = field(default_factory=lambda: list(SWEEP_PEERS))
    num_prompts: int = 6  # batch-1 prompts
    repeats: int = 1  # batch-1 passes over the prompts
    max_new_tokens: int = 64
    sweep_requests: int = 8  # requests per rate (and per concurrency level)
    sweep_max_new_tokens: int | tuple[int, int] = 32  # a (lo, hi) range draws each request's from length_dist
    length_dist: str = "uniform"  # or "log-uniform" (bench.workload.build)
    rates: list[float] = field(default_factory=list)  # req/s; empty: rate_factors x batch-1 capacity
    rate_factors: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    sweep_repeats: int = 1
    concurrency: list[int] = field(default_factory=list)  # closed-loop levels
    closed_factor: int = 2  # closed loop at concurrency N serves max(sweep_requests, closed_factor * N) requests
    prompt_mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PROMPT_MIX))
    slo_mix: dict[str, float] = field(default_factory=lambda: dict(ADASERVE_MIX))
    seed: int = 0
    warmup: int = 1  # requests per configuration before anything is recorded
    threads: int = 2  # torch threads of the HF peers (the services use torch's default)
    traces: bool = True  # span sink + overhead breakdown
    # profile the target and the draft first when this machine has none (`tandem profile --if-missing`): the
    # policies' cost models and AdaServe's budget B start from them (the CLI's presets set it)
    profile_first: bool = False
    max_prompt_tokens: int = 768
    queue_policy: str = "fcfs"
    stringent_shares: list[float] = field(default_factory=list)  # mix phase: shares of stringent requests
    share_rate_factor: float = 2.0  # mix phase rate, x batch-1 capacity (or share_rate req/s when set)
    share_rate: float | None = None
    bursty: bool = False  # one on/off trace after the sweep (phase "bursty"), sent sweep_repeats times
    interleave: bool = False  # all stacks up at once, configurations alternating (see Harness.run)
    # every batch-1 repeat, closed pass and the warm-up draw their own prompts (seed + phase offset) instead of
    # the same ones: a draft that remembers earlier outputs (the suffix draft's global tree) must not be
    # measured on a prompt whose answer it has already seen
    distinct_prompts: bool = False
    # every sweep repeat (each load point and the bursty trace) sends a prompt sample of its own, the same for every
    # configuration within the repeat: the pooled result then averages over prompt samples, not over one sample
    # sent again (which fixed k wins a load flipped between two runs of one sample on grounded prompts)
    sample_per_repeat: bool = False
    # every stack's draft (a model directory/name, or ngram[:..] / suffix[:..]) instead of the pair's; configurations
    # naming their own (draft:<x>:k<K>) keep theirs
    stack_draft: str | None = None
    # long-prompt arrivals (bench.long_prompts): this many requests with prompts of long_prompt_tokens tokens join
    # each open-loop load point's Poisson traffic, spread evenly over it, asking for long_max_new_tokens each under
    # the relaxed TPOT SLO and a TTFT SLO
    long_prompts: int = 0
    long_prompt_tokens: int = 2000
    long_max_new_tokens: int = 8
    long_ttft_factor: float = 3.0  # their TTFT SLO: this x a lone long prompt's TTFT (target-only, measured first)
    timeline: bool = False  # sample the scheduler's KV budget, offload state and load during each run (bench.offload)


def slo_options(**overrides) -> BenchOptions:
    """`make bench-slo`: the SLO_SWEEP configurations on the 60/20/20 mix, over rates and stringent shares."""
    preset = BenchOptions(
        name="slo",
        batch1=[],
        sweep=list(SLO_SWEEP),
        sweep_requests=24,
        rate_factors=[1.0, 2.0, 3.0, 4.0, 6.0],
        slo_mix=dict(ADASERVE_MIX),
        stringent_shares=list(SLO_STRINGENT_SHARES),
        share_rate_factor=3.0,
    )
    return replace(preset, **overrides)


def adaptive_options(**overrides) -> BenchOptions:
    """`make bench-adaptive`: ADAPTIVE_SWEEP (+ the Nightjar variants), Poisson from low to high load, one bursty trace."""
    from services.scheduler.policies import SPECULATION_POLICIES

    sweep = list(ADAPTIVE_SWEEP) + [c for c in ("policy:nightjar", "policy:nightjar-global") if c.split(":")[1] in SPECULATION_POLICIES]
    preset = BenchOptions(name="adaptive", batch1=[], sweep=sweep, sweep_requests=24,
                          rate_factors=[0.5, 1.0, 2.0, 4.0, 8.0], bursty=True, interleave=True)  # fmt: skip
    return replace(preset, **overrides)


def share_mix(stringent: float) -> dict[str, float]:
    """The SLO mix with ``stringent`` of the requests stringent, the rest split evenly (AdaServe §6.2)."""
    if not 0.0 <= stringent <= 1.0:
        raise ValueError(f"a share of stringent requests is in [0, 1], got {stringent}")
    rest = (1.0 - stringent) / 2
    return {"stringent": stringent, "moderate": rest, "relaxed": rest}


# LAPS-SD's comparison (§5.2): N requests at once (N = 10..50), more than the batch holds.
# laps-sd:est=1 is this project's variant: non-perceptible requests ranked by eq. 6 as well (laps_sd.py);
# +share=1 charges eq. 6's rounds at a request's share of the batched forward (remaining_time.py).
ORDER_SWEEP = ("order:fcfs", "order:las", "order:lp-sjf", "order:laps-sd", "order:laps-sd:est=1",
               "order:laps-sd:est=1+share=1")
ORDER_MAX_BATCH_SIZE = "4"  # TANDEM_MAX_BATCH_SIZE of the launched schedulers unless set


def order_options(**overrides) -> BenchOptions:
    """`make bench-order`: ORDER_SWEEP, N = 10/30/50 requests sent at once, heavy-tailed output lengths 8..256."""
    preset = BenchOptions(name="order", batch1=[], sweep=list(ORDER_SWEEP), rate_factors=[],
                          concurrency=[10, 30, 50], closed_factor=1, sweep_max_new_tokens=(8, 256),
                          length_dist="log-uniform")  # fmt: skip
    return replace(preset, **overrides)


# FASER's ablation (§6): serial SD, + frontier pipelining, + token-wise early exit, both; each variant a stack
# whose draft and target split the machine (bench.configs FASER_*).
FASER_SWEEP = ("faser:serial", "faser:pipe", "faser:ee", "faser:all")


def faser_options(**overrides) -> BenchOptions:
    """`make bench-faser`: FASER_SWEEP one request at a time (low load: TPOT), then Poisson at 0.5x and 4x capacity."""
    preset = BenchOptions(name="faser", batch1=list(FASER_SWEEP), sweep=list(FASER_SWEEP), sweep_requests=16,
                          rate_factors=[0.5, 4.0])  # fmt: skip
    return replace(preset, **overrides)


# Nightjar's elastic draft memory (§5.1) under a deliberately small KV pool: two stacks, offload on and off.
OFFLOAD_SWEEP = ("offload:on", "offload:off")


def offload_options(**overrides) -> BenchOptions:
    """`make bench-offload`: OFFLOAD_SWEEP closed loop at 4 and 12 concurrent requests, the KV budget sampled."""
    preset = BenchOptions(name="offload", batch1=[], sweep=list(OFFLOAD_SWEEP), rate_factors=[], concurrency=[4, 12],
                          sweep_requests=24, sweep_max_new_tokens=offload.MAX_NEW_TOKENS,
                          max_prompt_tokens=offload.MAX_PROMPT_TOKENS, timeline=True)  # fmt: skip
    return replace(preset, **overrides)


SAMPLE_STRIDE = 7919  # seed offset between two sweep repeats' prompt samples (a prime: no clash with load offsets)


def sample_offset(opts: BenchOptions, rep: int) -> int:
    """The seed offset of sweep repeat ``rep``'s prompt sample: 0 (one sample) unless ``sample_per_repeat``."""
    return SAMPLE_STRIDE * rep if opts.sample_per_repeat else 0


# --slo: these options (CLI name -> BenchOptions field) take slo_options()'s values unless given
SLO_PRESET = {"name": "name", "batch1": "batch1", "sweep": "sweep", "sweep_requests": "sweep_requests",
              "rate_factors": "rate_factors", "stringent_shares": "stringent_shares",
              "share_rate_factor": "share_rate_factor"}  # fmt: skip


FASER_PRESET = ("name", "batch1", "sweep", "sweep_requests", "rate_factors")
OFFLOAD_PRESET = ("name", "batch1", "sweep", "rate_factors", "concurrency", "sweep_requests", "sweep_max_new_tokens",
                  "max_prompt_tokens", "timeline")  # fmt: skip


def apply_preset(opts: BenchOptions, preset: BenchOptions, given: set[str], fields=FASER_PRESET) -> None:
    """``preset``'s value for each of ``fields`` the command line did not give."""
    for fld in fields:
        if fld not in given:
            setattr(opts, fld, getattr(preset, fld))


def _given(ctx: typer.Context) -> set[str]:
    return {k for k in ctx.params if getattr(ctx.get_parameter_source(k), "name", "") == "COMMANDLINE"}
