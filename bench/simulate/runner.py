"""The benches' phases over a pluggable backend: the simulator, or the real in-process stack.

    SimBackend    the real Scheduler (its queue and speculation policies, by the benches'
                  configuration names) on a FakeClock, with SimTarget / SimDraft
    (fidelity.py) the same Scheduler on the real clock with the real engines in-process

Both are driven by bench.drivers (open loop, closed loop) through ``scheduler_sender``,
over workloads built by bench.workload / bench.arrivals exactly as bench.harness builds
them, and summarized by bench.report into the harness's results layout::

    batch1     num_prompts requests one at a time, every configuration
    baseline   target-only TPOT at batch 1: the stringent SLO class (bench.slo), and the rates
    sweep      open-loop Poisson at each rate        bursty   one on/off trace
    closed     closed loop at each concurrency       mix      one rate, shares of stringent requests
"""

from __future__ import annotations

import asyncio
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from bench import arrivals, report
from bench.configs import Config, parse_list
from bench.drivers import Job, OnChunk, Outcome, Record, Run, Sender, closed_loop, open_loop
from bench.simulate.acceptance import AcceptanceTrace, replay_key
from bench.simulate.shared_processor import SharedProcessor
from bench.simulate.step_costs import StepCosts, fitted
from bench.simulate.workers import STOP_TOKEN, SimBook, SimDraft, SimTarget
from bench.slo import ADASERVE_MIX
from bench.tokens import EncodedItem, PromptEncoder
from bench.workload import build
from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.request import SLO, Request, SpecMode, SpeculationSetting
from scheduler.workers import FakeClock, IterationObserver

DEFAULT_PROMPT_MIX = {"chat": 0.5, "code": 0.25, "summarize": 0.25}


@dataclass
class SimOptions:
    """One run's phases and workload (bench.harness.BenchOptions' fields of the same names)."""

    name: str = "simulate"
    batch1: list[str] = field(default_factory=lambda: ["target-only", "tandem-k3"])
    sweep: list[str] = field(default_factory=lambda: ["target-only", "tandem-k3"])
    num_prompts: int = 6
    max_new_tokens: int = 64
    sweep_requests: int = 24
    sweep_max_new_tokens: int | tuple[int, int] = 32
    length_dist: str = "uniform"
    rates: list[float] = field(default_factory=list)  # req/s; empty: rate_factors x batch-1 capacity
    rate_factors: list[float] = field(default_factory=lambda: [1.0, 2.0, 4.0])
    concurrency: list[int] = field(default_factory=list)
    closed_factor: int = 2
    bursty: bool = False
    bursty_rates: tuple[float, float] | None = None  # (on, off) req/s; None: the harness's (max rate, min / 4)
    stringent_shares: list[float] = field(default_factory=list)
    share_rate: float | None = None
    prompt_mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_PROMPT_MIX))
    slo_mix: dict[str, float] = field(default_factory=lambda: dict(ADASERVE_MIX))
    seed: int = 0
    max_prompt_tokens: int = 768
    baseline_tpot_ms: float | None = None  # given: not measured (the fidelity run passes the real run's)
    baseline_ttft_s: float | None = None


class Backend(Protocol):
    async def run(self, config: Config, jobs: list[Job], mode: str, concurrency: int) -> Run: ...


def scheduler_sender(scheduler: Scheduler, config: Config, stop_token_ids: list[int],
                     on_submit: Callable[[Request, Job], None] | None = None) -> Sender:  # fmt: skip
    """bench.tandem_sender's contract over a Scheduler in this process: the first chunk is the prefill's."""
    if config.speculation == "off":
        setting = SpeculationSetting(SpecMode.OFF)
    elif config.speculation == "auto":
        setting = SpeculationSetting(SpecMode.AUTO)
    else:
        setting = SpeculationSetting(SpecMode.FIXED, int(config.speculation))

    async def send(job: Job, on_chunk: OnChunk) -> Outcome:
        req = Request(id=job.request_id, prompt_ids=list(job.encoded.prompt_ids), max_new_tokens=job.max_new_tokens,
                      stop_token_ids=list(stop_token_ids), slo=SLO(tpot_ms=job.tpot_slo_ms), speculation=setting)  # fmt: skip
        if on_submit is not None:
            on_submit(req, job)
        first, accepted = True, 0
        async for event in scheduler.submit(req):
            if event.token_ids:
                on_chunk(event.token_ids, req.num_accepted_tokens - accepted, not first)
                accepted, first = req.num_accepted_tokens, False
        reason = {"stop_token": "stop", "length": "length"}.get(req.finish_reason.value, req.finish_reason.value)
        return Outcome(finish_reason=reason, num_steps=None,
                       num_draft_tokens=req.num_drafted_tokens, num_accepted_tokens=req.num_accepted_tokens,
                       error=req.error)  # fmt: skip

    return send


async def drive(scheduler: Scheduler, config: Config, jobs: list[Job], timer, mode: str, concurrency: int,
                stop_token_ids: list[int], on_submit=None) -> Run:  # fmt: skip
    """Run the scheduler's loop while the driver sends ``jobs``; stop it after."""
    task = asyncio.create_task(scheduler.run())
    send = scheduler_sender(scheduler, config, stop_token_ids, on_submit)
    try:
        if mode == "open":
            return await open_loop(config.name, jobs, send, timer)
        return await closed_loop(config.name, jobs, send, timer, concurrency)
    finally:
        scheduler.stop()
        await task


class VirtualTimer:
    """bench.drivers' Timer on the simulation's clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def now(self) -> float:
        return self.clock.now()

    async def sleep_until(self, t: float) -> None:
        await self.clock.sleep(t - self.clock.now())


@dataclass
class SimStack:
    """What the simulated stack is: step costs, acceptance, scheduler caps and policies."""

    target: StepCosts
    draft: StepCosts | None = None
    trace: AcceptanceTrace | None = None
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    draft_reload_s: float = 0.0
    give_cost_models: bool = True  # hand the policies the cost model and B fitted to the charged costs
    shared_processor: bool = False  # target and draft on the same cores (a CPU): overlapping calls share them

    def scheduler_config(self) -> SchedulerConfig:
        cfg = self.config
        if not self.give_cost_models:
            return cfg
        update = {}
        if cfg.cost_model is None or cfg.token_budget is None:
            cm, budget = fitted(self.target)
            update |= {"cost_model": cfg.cost_model or cm, "token_budget": cfg.token_budget or budget}
        if cfg.draft_cost_model is None and self.draft is not None and self.draft.forward_s(1, 1, 64) > 0:
            update["draft_cost_model"] = fitted(self.draft)[0]
        return cfg.model_copy(update=update)


class SimBackend:
    """Each (configuration, load) on a fresh simulated stack and clock: nothing carries over between runs."""

    def __init__(self, stack: SimStack, seed: int = 0, output_len: Callable[[Job], int] | None = None,
                 observers: Callable[[], list[IterationObserver]] | None = None,
                 per_config: Callable[[Config, SchedulerConfig], SchedulerConfig] | None = None) -> None:  # fmt: skip
        self.stack = stack
        self.per_config = per_config  # a configuration's own scheduler settings (e.g. offload:on's elastic memory)
        self.seed = seed
        self.output_len = output_len or (lambda job: job.max_new_tokens)
        self.observers = observers
        self.sched_config = stack.scheduler_config()
        self.busy: dict[str, float] = defaultdict(float)  # config -> target busy seconds

    async def run(self, config: Config, jobs: list[Job], mode: str, concurrency: int) -> Run:
        from services.scheduler.policies import queue_policy, speculation_policy

        clock = FakeClock()
        book = SimBook(self.stack.trace, self.seed)
        for j in jobs:
            book.add(j.request_id, j.encoded.item.prompt.kind, len(j.encoded.prompt_ids), self.output_len(j),
                     replay_key(j.encoded.prompt_ids, j.max_new_tokens))  # fmt: skip
        cpu = SharedProcessor(clock) if self.stack.shared_processor else None
        target = SimTarget(book, self.stack.target, clock, self.seed, cpu)
        draft = None
        if self.stack.draft is not None:
            draft = SimDraft(book, self.stack.draft, clock, self.stack.draft_reload_s, cpu)
        cfg, key = self.sched_config, config.stack
        if self.per_config is not None:
            cfg = self.per_config(config, cfg)
        scheduler = Scheduler(
            target, draft, config=cfg, clock=clock,
            spec_policy=speculation_policy(key.speculation_policy) if key else None,
            queue_policy=queue_policy(key.queue_policy, cost_model=cfg.cost_model,
                                      draft_cost_model=cfg.draft_cost_model) if key else None,
            observers=self.observers() if self.observers else (),
        )  # fmt: skip
        run = await drive(scheduler, config, jobs, VirtualTimer(clock), mode, concurrency, [STOP_TOKEN])
        self.busy[config.name] += target.busy_s
        return run


class Phases:
    """bench.harness's phases over any Backend; ``results()`` is the harness's results layout."""

    def __init__(self, opts: SimOptions, backend: Backend, encoder: PromptEncoder, log=print) -> None:
        self.opts = opts
        self.backend = backend
        self.encoder = encoder
        self.log = log
        self.records: dict[str, dict[str, dict[str, list[Record]]]] = defaultdict(lambda: defaultdict(dict))
        self.walls: dict[tuple[str, str, str], float] = defaultdict(float)
        self.baseline_tpot_ms = opts.baseline_tpot_ms
        self.baseline_ttft_s = opts.baseline_ttft_s
        self._encoded: dict[tuple[str, str], tuple[int, ...]] = {}

    # ------------------------------------------------------------------ workload (bench.harness._items)
    def items(self, n: int, rate: float | None, max_new_tokens, seed_offset: int = 0,
              slo_mix: dict[str, float] | None = None, times: list[float] | None = None) -> list[EncodedItem]:  # fmt: skip
        o = self.opts
        if times is None and rate is not None:
            times = arrivals.poisson(rate, n, o.seed + seed_offset)
        work = build(n, arrivals=times, prompt_mix=o.prompt_mix, slo_mix=slo_mix or o.slo_mix,
                     max_new_tokens=max_new_tokens, seed=o.seed, length_dist=o.length_dist)  # fmt: skip
        return [EncodedItem(it, self._encode(it)) for it in work]

    def _encode(self, item) -> tuple[int, ...]:
        key = (item.prompt.kind, item.prompt.text)
        if key not in self._encoded:  # 10,000 requests draw from a few hundred prompts
            self._encoded[key] = self.encoder.encode(item.prompt.text, item.prompt.messages())
        return self._encoded[key]

    def jobs(self, config: Config, tag: str, items: list[EncodedItem]) -> list[Job]:
        slo = self.baseline_tpot_ms
        return [Job(it, it.item.slo.tpot_ms(slo) if slo else None, f"{config.name}/{tag}-i{it.index}") for it in items]

    # ------------------------------------------------------------------ phases
    async def run(self) -> None:
        o = self.opts
        b1, sw = parse_list(o.batch1), parse_list(o.sweep)
        if b1:
            await self.batch1(b1)
        if self.baseline_tpot_ms is None:
            await self.baseline()
        if sw:
            for ri, rate in enumerate(self.rates()):
                await self.load("sweep", f"rate={rate:.3g}", sw, self.items(o.sweep_requests, rate,
                                o.sweep_max_new_tokens, seed_offset=ri), "open", tag=f"sweep{ri}")  # fmt: skip
            if o.bursty:
                hi, lo = o.bursty_rates or (max(self.rates()), min(self.rates()) / 4)
                period = o.sweep_requests / (hi + lo)
                times = arrivals.on_off(hi, lo, period, 0.5, o.sweep_requests, o.seed + 300)
                items = self.items(o.sweep_requests, None, o.sweep_max_new_tokens, seed_offset=300, times=times)
                await self.load("bursty", f"on={hi:.3g},off={lo:.3g},period={period:.3g}s", sw, items, "open", "bursty")
            for ci, conc in enumerate(o.concurrency):
                items = self.items(max(o.sweep_requests, o.closed_factor * conc), None, o.sweep_max_new_tokens,
                                   seed_offset=100 + ci)  # fmt: skip
                await self.load("closed", f"concurrency={conc}", sw, items, "closed", f"closed{ci}", conc)
            for si, share in enumerate(o.stringent_shares):
                rest = (1.0 - share) / 2
                mix = {"stringent": share, "moderate": rest, "relaxed": rest}
                items = self.items(o.sweep_requests, self.share_rate(), o.sweep_max_new_tokens, 200 + si, mix)
                await self.load("mix", f"stringent={share:.2f}", sw, items, "open", f"mix{si}")

    async def batch1(self, configs: list[Config]) -> None:
        items = self.items(self.opts.num_prompts, None, self.opts.max_new_tokens)
        for c in configs:
            for it in items:
                run = await self.backend.run(c, self.jobs(c, "b1", [it]), "closed", 1)
                self.records["batch1"]["batch=1"].setdefault(c.name, []).extend(run.records)
        plain = self.records["batch1"]["batch=1"].get("target-only")
        if plain and self.baseline_tpot_ms is None:
            self._set_baseline(plain)

    async def baseline(self) -> None:
        c = parse_list(["target-only"])[0]
        run = await self.backend.run(c, self.jobs(c, "baseline", self.items(3, None, 32, seed_offset=555)), "closed", 1)
        self._set_baseline(run.records)

    def _set_baseline(self, records: list[Record]) -> None:
        tpots = [r.trace.tpot_s for r in records if r.trace.tpot_s]
        self.baseline_tpot_ms = statistics.median(tpots) * 1e3
        self.baseline_ttft_s = statistics.median([r.trace.ttft_s for r in records if r.trace.ttft_s is not None])
        self.log(f"baseline: target-only TPOT {self.baseline_tpot_ms:.2f} ms, TTFT {self.baseline_ttft_s * 1e3:.1f} ms")

    def rates(self) -> list[float]:
        o = self.opts
        if o.rates:
            return list(o.rates)
        n = o.sweep_max_new_tokens if isinstance(o.sweep_max_new_tokens, int) else sum(o.sweep_max_new_tokens) / 2
        one = self.baseline_ttft_s + (n - 1) * self.baseline_tpot_ms / 1e3
        return [f / one for f in o.rate_factors]

    def share_rate(self) -> float:
        return self.opts.share_rate if self.opts.share_rate is not None else 3.0 * self.rates()[0]

    async def load(self, phase: str, load: str, configs: list[Config], items: list[EncodedItem], mode: str,
                   tag: str, concurrency: int = 1) -> None:  # fmt: skip
        for c in configs:
            run = await self.backend.run(c, self.jobs(c, tag, items), mode, concurrency)
            self.records[phase][load].setdefault(c.name, []).extend(run.records)
            if run.records:
                self.walls[(phase, load, c.name)] += max((r.trace.latency_s or 0) + r.trace.sent_s for r in run.records)
            self.log(f"{phase} {load} {c.name}: {len(run.records)} requests")

    # ------------------------------------------------------------------ results (bench.harness._results)
    def results(self, **extra) -> dict:
        out: dict = {"name": self.opts.name, "baseline_tpot_ms": self.baseline_tpot_ms,
                     "baseline_ttft_s": self.baseline_ttft_s, **extra}  # fmt: skip
        b1 = self.records["batch1"].get("batch=1", {})
        for recs in b1.values():
            for r in recs:
                r.trace.tpot_slo_ms = r.job.encoded.item.slo.tpot_ms(self.baseline_tpot_ms)
        out["batch1"] = {n: {"summary": report.summarize_records(recs, report.batch1_wall_s(recs))}
                         for n, recs in b1.items()}  # fmt: skip
        for phase in ("sweep", "closed", "mix", "bursty"):
            out[phase] = {
                load: {n: {"summary": report.summarize_records(recs, self.walls[(phase, load, n)])}
                       for n, recs in per.items()}
                for load, per in self.records.get(phase, {}).items()
            }  # fmt: skip
        return out
