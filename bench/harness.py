"""The benchmark harness: several configurations side by side, one run, one workload, one seed.

    python -m bench.harness                         # `make bench`: the short default suite, demo pair
    python -m bench.harness --long                  # longer sweeps (more prompts, repeats, rates, concurrency)
    python -m bench.harness --pair tiny --name smoke --batch1 target-only,tandem-k3 --sweep ''
    python -m bench.harness --slo                   # `make bench-slo`: AdaServe's comparison (SLO_SWEEP)
    python -m bench.harness --adaptive              # `make bench-adaptive`: fixed k vs adaptive length (ADAPTIVE_SWEEP)
    python -m bench.harness --faser                 # `make bench-faser`: FASER's ablation (FASER_SWEEP)
    python -m bench.harness --offload               # `make bench-offload`: draft offload under a small KV pool

What one run does::

    encode prompts once (bench.tokens)          same token ids for every configuration
    for each distinct stack (policy, queue):    services.launcher, as `tandem up` starts it, + span sink
        warm-up                                 per configuration, not recorded
        batch 1     prompt by prompt, every configuration in turn, order rotated per prompt and
                    repeat; Tandem through AsyncClient streams, HF peers in this process
        baseline    TPOT of target-only at batch 1 (median): the stringent SLO class; the other
                    classes and the sweep rates scale from it (bench.slo)
        sweep       open-loop Poisson at each rate, configurations back to back, order rotated
        closed      closed-loop at each concurrency (--concurrency / --long)
        bursty      (--bursty) one on/off trace: Poisson at the highest sweep rate half of each period,
                    a quarter of the lowest in the other half (bench.arrivals.on_off)
        mix         open-loop Poisson at one rate (share_rate_factor x capacity), the share of
                    stringent requests varied (--stringent-shares; the rest split evenly
                    between moderate and relaxed), configurations back to back
    stop the stack: the services flush their spans; bench.overhead splits iteration time
    results.json, PNGs (bench.plots), rich tables   under bench/results/<name>/

Configurations (bench.configs): target-only, tandem-k<K>, policy:<name>,
hf-target, hf-assisted, hf-assisted-heuristic. Tandem configurations that
differ only in per-request speculation share a stack; HF peers join the batch-1
rotation of the first stack (they cannot serve concurrent load).

``--slo`` (``slo_options``) is AdaServe's evaluation (§6.2): the mixed
three-class workload, plain decoding, a fixed chain, the SpecInfer tree,
EqualGreedy, GlobalGreedy and AdaServe side by side, SLO attainment and
goodput vs request rate and vs the share of stringent requests. The tree
policies' budget B is what the launched scheduler reads (TANDEM_TOKEN_BUDGET,
else the target's profile from `tandem profile`); results.json records it.

``--order`` (``order_options``, `make bench-order`) is LAPS-SD's evaluation (§5.2):
the queue policies fcfs, las, lp-sjf, laps-sd and laps-sd:est=1 (configurations
``order:<policy>``, a chain of 3 per request, one stack each) side by side, N =
10/30/50 requests sent at once (closed loop at N with N requests) over mixed
prompts and heavy-tailed output bounds (8..256 new tokens, log-uniform; a stop
token may end a request sooner), with the scheduler's batch capped
(TANDEM_MAX_BATCH_SIZE, default 4 here) so that requests queue and the order matters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from bench import adaptive_goals, arrivals, offload, overhead, plots, prom, report, results_readme
from bench.configs import Config, StackKey, parse, parse_list, rotated
from bench.drivers import Job, RealTimer, Record, Run, closed_loop, open_loop
from bench.hf_peer import HFPeer
from bench.long_prompts import LONG, encoded_long_items, measure_long_baseline
from bench.options import (  # noqa: F401 - presets re-exported: tests and the CLI reach them here
    ADAPTIVE_SWEEP,
    FASER_SWEEP,
    OFFLOAD_SWEEP,
    ORDER_SWEEP,
    SLO_SWEEP,
    BenchOptions,
    adaptive_options,
    faser_options,
    offload_options,
    order_options,
    sample_offset,
    share_mix,
    slo_options,
)
from bench.run_info import ensure_profiles, faser_split, git_commit, jsonable, machine, target_threads, token_budget  # noqa: F401 - machine re-exported (bench.drafts, ...)
from bench.stack import Models, bench_stack
from bench.tandem_sender import tandem_sender
from bench.tokens import EncodedItem, PromptEncoder
from bench.workload import build
from sdk.client import AsyncClient

RESULTS_ROOT = Path(__file__).resolve().parent / "results"
MAX_PARALLEL_STARTS = 8  # stacks an interleaved run starts at once


# --- one run --------------------------------------------------------------------------------------


class Harness:
    def __init__(self, opts: BenchOptions, out_dir: Path, console: Console | None = None) -> None:
        self.opts = opts
        self.out_dir = out_dir
        self.console = console or Console()
        self.timer = RealTimer()
        self.notes: list[str] = []
        # phase -> load label -> config -> records;  batch 1 uses the load label "batch=1"
        self.records: dict[str, dict[str, dict[str, list[Record]]]] = defaultdict(lambda: defaultdict(dict))
        self.prom: dict[tuple[str, str, str], prom.Scrape] = defaultdict(prom.Scrape)
        self.overheads: dict[tuple[str, str, str], dict | None] = {}
        # (phase, load, config) -> repeat -> that run's step times by shape: how fast the machine ran it
        self.run_steps: dict[tuple[str, str, str], dict[int, dict]] = defaultdict(dict)
        self.timelines: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
        self.walls: dict[tuple[str, str, str], float] = defaultdict(float)  # wall time of the runs behind a row
        self.run_latency: dict[tuple[str, str, str], list[float]] = defaultdict(list)  # each run's mean latency
        self.baseline_tpot_ms: float | None = None
        self.long_baseline_ttft_s: float | None = None  # a lone long prompt's TTFT (long-prompt arrivals only)
        self.long_ttft_slo_ms: float | None = None
        self.baseline_latency_s: float | None = None
        self.metrics_url: str | None = None  # the stack being measured (one stack at a time)
        self.metrics_urls: dict[str, str | None] = {}  # config -> its stack's, when interleaved
        self.configs: tuple[list[Config], list[Config]] = ([], [])

    def log(self, msg: str) -> None:
        self.console.log(msg)

    # ------------------------------------------------------------------ setup
    def _configs(self) -> tuple[list[Config], list[Config]]:
        q = self.opts.queue_policy
        b1, sw = parse_list(self.opts.batch1, queue_policy=q), parse_list(self.opts.sweep, queue_policy=q)
        if self.opts.stack_draft:  # every stack drafts with it unless the configuration names its own
            b1, sw = [self._with_draft(c) for c in b1], [self._with_draft(c) for c in sw]
        if any(not c.is_tandem for c in sw):
            raise ValueError("HF peers run at batch 1 only; leave them out of the sweep")
        if self.draft_dir is None:  # configurations that bring their own draft (draft:<x>:k<K>) stay
            own = lambda c: c.stack is not None and c.stack.draft_model is not None  # noqa: E731
            dropped = [c.name for c in b1 + sw if c.speculates and not own(c)]
            if dropped:
                self.notes.append(f"no draft model prepared: left out {sorted(set(dropped))}")
                self.log(f"[yellow]{self.notes[-1]}")
            b1, sw = [c for c in b1 if not c.speculates or own(c)], [c for c in sw if not c.speculates or own(c)]
        return b1, sw

    def _with_draft(self, c: Config) -> Config:
        if not c.is_tandem or c.stack is None or c.stack.draft_model is not None:
            return c
        return dataclasses.replace(c, stack=dataclasses.replace(c.stack, draft_model=self.opts.stack_draft))

    def _items(self, n: int, rate: float | None, max_new_tokens: int, seed_offset: int = 0,
               slo_mix: dict[str, float] | None = None, times: list[float] | None = None,
               arrival_offset: int = 0, own_sample: bool = False) -> list[EncodedItem]:  # fmt: skip
        """``n`` encoded items. Prompts and bounds come from the run's seed, the same in every phase, unless
        ``own_sample`` or ``distinct_prompts``: then from seed + ``seed_offset`` (a draw of its own)."""
        o = self.opts
        if times is None and rate is not None:
            times = arrivals.poisson(rate, n, o.seed + seed_offset + arrival_offset)
        seed = o.seed + seed_offset if o.distinct_prompts or own_sample else o.seed
        items = build(n, arrivals=times, prompt_mix=o.prompt_mix, slo_mix=slo_mix or o.slo_mix,
                      max_new_tokens=max_new_tokens, seed=seed, length_dist=o.length_dist)  # fmt: skip
        return self.encoder.encode_all(items)

    def _split_threads(self) -> tuple[int | None, ...]:
        """The CPU thread counts to profile at: torch's default, and the target's and draft's counts when
        FASER's stacks split the cores between them (each service then reads a profile at its own count)."""
        split = faser_split(self.opts.models, [*self.opts.batch1, *self.opts.sweep])
        return (None,) if split is None else (None, *sorted(set(split)))

    # ------------------------------------------------------------------ the run
    async def run(self) -> dict:
        o = self.opts
        self.target_dir = o.models.target_dir()
        self.draft_dir = o.models.draft_dir()
        self.encoder = PromptEncoder.for_model(self.target_dir, o.max_prompt_tokens)
        if o.profile_first:
            self.notes += ensure_profiles(o.models, self.log, self._split_threads())
        self.token_budget = await token_budget(o.models, self.target_dir,
                                               target_threads(o.models, [*o.batch1, *o.sweep]))
        if self.token_budget["source"] == "none":
            self.notes.append("no target profile on this machine: no budget B, the policies' cost models start from "
                              "the generic prior (`tandem profile`, or the presets' --profile)")
            self.log(f"[yellow]{self.notes[-1]}")
        self.eos = self.encoder.eos_token_ids
        b1, sw = self._configs()
        self.configs = (b1, sw)  # what a checkpoint reports on
        hf_configs = [c for c in b1 if not c.is_tandem]
        self.hf = None
        if hf_configs:
            self.log(f"loading HF peers from {self.target_dir.name} / {self.draft_dir and self.draft_dir.name}")
            self.hf = HFPeer.load(self.target_dir, self.draft_dir, threads=o.threads)
        self.b1_items = self._items(o.num_prompts, None, o.max_new_tokens)

        keys = list(dict.fromkeys([c.stack for c in b1 + sw if c.is_tandem] or [StackKey(queue_policy=o.queue_policy)]))
        self.t_start = time.time()
        self.commit = git_commit()  # at the start: what the run measured, before any later edit
        if o.interleave and len(keys) > 1:
            await self._interleaved(keys, b1, sw)
        else:
            for n, key in enumerate(keys):
                here_b1 = [c for c in b1 if (c.stack == key) or (not c.is_tandem and n == 0)]
                here_sw = [c for c in sw if c.stack == key]
                await self._on_stack(key, n, here_b1, here_sw)
        return self._results(b1, sw)

    async def _interleaved(self, keys: list[StackKey], b1: list[Config], sw: list[Config]) -> None:
        """Every stack up at once, and every phase alternating over all configurations.

        One stack after the other, configurations of different stacks are measured minutes
        apart, and on a shared machine its speed drifts by more than the differences looked
        for (5-25 % between two runs an hour apart here). Interleaved, each load point sends
        its configurations one after the other, in an order rotated per load and per repeat,
        so drift falls on all of them alike. Idle stacks cost memory, not time (their
        services wait on sockets; OMP_WAIT_POLICY=PASSIVE)."""
        o = self.opts
        requests: dict[str, tuple[str, str, str]] = {}
        senders: dict[str, object] = {}
        self.metrics_urls = {}
        with ExitStack() as on_exit:
            stacks = self._start_all(keys, on_exit)  # blocking, as starting one stack always was: nothing else runs yet
            async with AsyncExitStack() as clients:
                for n, (key, stack) in enumerate(zip(keys, stacks)):
                    client = await clients.enter_async_context(AsyncClient(stack.endpoints.scheduler, timeout=1800))
                    here = [c for c in b1 + sw if c.is_tandem and c.stack == key]
                    if n == 0:
                        here.append(parse("target-only"))  # the baseline, on the first stack
                    for c in here:
                        if c.name not in senders:
                            senders[c.name] = tandem_sender(client, c, self.eos)
                            self.metrics_urls[c.name] = stack.endpoints.metrics_url
                for c in b1:
                    if not c.is_tandem:
                        senders[c.name] = self.hf.sender(c, self.eos)
                await self._phases(b1, sw, senders, requests)
        for n, stack in enumerate(stacks):
            self._collect_overheads(n, stack, requests)
        self._checkpoint()

    def _start_all(self, keys: list[StackKey], on_exit: ExitStack) -> list:
        """Every stack at once, one thread each: their imports, model loading and (on a GPU) CUDA start-up
        overlap, which one after the other cost ~25 s a stack on an H200. Each stack that came up is
        registered on ``on_exit`` (stopped on the way out) even when another failed or the run is stopped
        while they start; the first failure is raised."""
        o = self.opts

        def start_one(n: int, key: StackKey):
            log_dir = self.out_dir / "logs" / f"stack{n}"
            self.log(f"starting stack {n} ({key.speculation_policy}, {key.queue_policy}); logs in {log_dir}")
            cm = bench_stack(o.models, key, log_dir, traces=o.traces)
            return cm, cm.__enter__()

        t = time.monotonic()
        pool = ThreadPoolExecutor(max_workers=min(len(keys), MAX_PARALLEL_STARTS), thread_name_prefix="stack-start")
        futures = [pool.submit(start_one, n, key) for n, key in enumerate(keys)]
        try:
            stacks = [f.result()[1] for f in futures]
        finally:
            pool.shutdown(wait=True)  # a stack still starting finishes starting, so that it can be stopped
            for f in futures:
                if not f.cancelled() and f.exception() is None:
                    on_exit.push(f.result()[0].__exit__)
        self.log(f"{len(keys)} stacks up in {time.monotonic() - t:.1f} s")
        return stacks

    async def _on_stack(self, key: StackKey, n: int, b1: list[Config], sw: list[Config]) -> None:
        o = self.opts
        log_dir = self.out_dir / "logs" / f"stack{n}"
        self.log(f"starting stack {n} ({key.speculation_policy}, {key.queue_policy}); logs in {log_dir}")
        requests: dict[str, tuple[str, str, str]] = {}  # request id -> (phase, load, config)
        with bench_stack(o.models, key, log_dir, traces=o.traces) as stack:
            self.metrics_url = stack.endpoints.metrics_url
            async with AsyncClient(stack.endpoints.scheduler, timeout=1800) as client:
                senders = {}
                for c in {c.name: c for c in b1 + sw + [parse("target-only")]}.values():
                    if c.is_tandem:
                        senders[c.name] = tandem_sender(client, c, self.eos)
                    else:
                        senders[c.name] = self.hf.sender(c, self.eos)
                await self._phases(b1, sw, senders, requests)
        self._collect_overheads(n, stack, requests)
        self._checkpoint()

    def _collect_overheads(self, n: int, stack, requests: dict[str, tuple[str, str, str]]) -> None:
        """The overhead breakdown of each (phase, load, config) whose requests this stack served."""
        if stack.sink is None:
            return
        spans = stack.sink.spans()
        per_request = {rid: "|".join(g) for rid, g in requests.items()}
        for group_key, result in overhead.by_config(spans, per_request).items():
            self.overheads[tuple(group_key.split("|"))] = result  # by_config only returns groups it saw
        per_run = {rid: f"{'|'.join(g)}|{report.repeat_of(rid)}" for rid, g in requests.items()}
        for group_key, result in overhead.by_config(spans, per_run).items():
            *group, rep = group_key.split("|")
            if result:
                self.run_steps[tuple(group)][int(rep)] = result["step_ms_by_batch_k"]
        self.log(f"stack {n}: {len(spans)} spans received")

    async def _phases(self, b1: list[Config], sw: list[Config], senders, requests) -> None:
        o = self.opts
        await self._warmup(b1 + [c for c in sw if c not in b1], senders)
        if b1:
            await self._batch1(b1, senders, requests)
        if self.baseline_tpot_ms is None:
            await self._measure_baseline(senders["target-only"], requests)
        if o.long_prompts and sw:
            await measure_long_baseline(self, senders["target-only"], requests)
        if sw:
            await self._sweep(sw, senders, requests)
            if o.bursty:
                await self._bursty(sw, senders, requests)
            if o.concurrency:
                await self._closed(sw, senders, requests)
            if o.stringent_shares:
                await self._shares(sw, senders, requests)

    def _metrics_url(self, config: Config) -> str | None:
        return self.metrics_urls.get(config.name) if self.metrics_urls else self.metrics_url

    async def _send(self, phase: str, load: str, config: Config, jobs: list[Job], senders, requests,
                    mode: str, concurrency: int = 1) -> Run:  # fmt: skip
        metrics_url = self._metrics_url(config)
        before = prom.scrape(metrics_url) if config.is_tandem else None
        send = senders[config.name]
        async with offload.Timeline(metrics_url if self.opts.timeline and config.is_tandem else None) as tl:
            if mode == "open":
                run = await open_loop(config.name, jobs, send, self.timer)
            else:
                run = await closed_loop(config.name, jobs, send, self.timer, concurrency)
        self.timelines[(phase, load, config.name)] += tl.samples
        if before is not None:
            self.prom[(phase, load, config.name)] += prom.scrape(metrics_url) - before
        for j in jobs:
            requests[j.request_id] = (phase, load, config.name)
        self.records[phase][load].setdefault(config.name, []).extend(run.records)
        if run.records:  # from the first send to the last answer; repeats add up
            wall = max((r.trace.latency_s or 0) + r.trace.sent_s for r in run.records)
            self.walls[(phase, load, config.name)] += wall
            lat = [r.trace.latency_s for r in run.records if r.trace.latency_s is not None]
            if lat:
                self.run_latency[(phase, load, config.name)].append(statistics.fmean(lat))
        for r in run.records:
            if r.error:
                self.log(f"[red]{r.job.request_id}: {r.error}")
        self._checkpoint()
        return run

    async def _warmup(self, configs: list[Config], senders) -> None:
        # prompts of their own: with the prefix cache on, a measured prompt sent here would be served from the cache
        items = self._items(max(1, self.opts.warmup), None, 8, seed_offset=999, own_sample=True)
        for c in configs:
            jobs = [Job(it, None, f"{c.name}/warmup-{i}") for i, it in enumerate(items)]
            await closed_loop(c.name, jobs, senders[c.name], self.timer, 1)
        self.log(f"warm-up done ({len(configs)} configurations)")

    async def _batch1(self, configs: list[Config], senders, requests) -> None:
        o = self.opts
        t = time.perf_counter()
        for rep in range(o.repeats):
            items = self.b1_items
            if o.distinct_prompts and rep:
                items = self._items(o.num_prompts, None, o.max_new_tokens, seed_offset=7919 * rep)
            for i, enc in enumerate(items):
                for c in rotated(configs, i + rep):
                    job = Job(enc, None, f"{c.name}/b1-r{rep}-i{enc.index}")
                    await self._send("batch1", "batch=1", c, [job], senders, requests, "closed")
            self.log(f"batch 1: repeat {rep + 1}/{o.repeats} done ({time.perf_counter() - t:.0f} s)")
        plain = self.records["batch1"]["batch=1"].get("target-only")
        if plain:
            self._set_baseline(plain)

    def _set_baseline(self, records: list[Record]) -> None:
        tpots = [r.trace.tpot_s for r in records if r.trace.tpot_s]
        ttfts = [r.trace.ttft_s for r in records if r.trace.ttft_s is not None]
        if not tpots:
            raise RuntimeError("target-only produced no TPOT: cannot scale the SLO classes")
        self.baseline_tpot_ms = statistics.median(tpots) * 1e3
        self.baseline_ttft_s = statistics.median(ttfts)
        self.log(f"baseline: target-only TPOT {self.baseline_tpot_ms:.1f} ms, TTFT {self.baseline_ttft_s * 1e3:.0f} ms")

    async def _measure_baseline(self, send, requests) -> None:
        items = self._items(3, None, 32, seed_offset=555, own_sample=True)  # not a measured prompt: none is cached
        c = parse("target-only")
        jobs = [Job(it, None, f"target-only/baseline-{i}") for i, it in enumerate(items)]
        run = await self._send("baseline", "batch=1", c, jobs, {"target-only": send}, requests, "closed")
        self._set_baseline(run.records)

    def _rates(self) -> list[float]:
        o = self.opts
        if o.rates:
            return list(o.rates)
        n = o.sweep_max_new_tokens if isinstance(o.sweep_max_new_tokens, int) else sum(o.sweep_max_new_tokens) / 2
        one = self.baseline_ttft_s + (n - 1) * self.baseline_tpot_ms / 1e3  # a lone request
        return [f / one for f in o.rate_factors]

    def _jobs(self, config: Config, tag: str, rep: int, items: list[EncodedItem]) -> list[Job]:
        jobs = []
        for it in items:
            rid = f"{config.name}/{tag}-r{rep}-i{it.index}"
            long = it.item.slo is LONG  # a long prompt measures its prefill: never from another run's cached KV
            jobs.append(Job(it, it.item.slo.tpot_ms(self.baseline_tpot_ms), rid,
                            self.long_ttft_slo_ms if long else None, rid if long else ""))  # fmt: skip
        return jobs

    async def _sweep(self, configs: list[Config], senders, requests) -> None:
        o = self.opts
        for rep in range(o.sweep_repeats):
            for ri, rate in enumerate(self._rates()):
                # each repeat draws its own Poisson arrivals (the same for every configuration within it): with
                # one trace repeated, a configuration whose steps happened to line up with it kept its luck
                items = self._items(o.sweep_requests, rate, o.sweep_max_new_tokens,
                                    seed_offset=ri + sample_offset(o, rep), arrival_offset=1000 * rep,
                                    own_sample=o.sample_per_repeat)  # fmt: skip
                if o.long_prompts:  # spread over the span of the Poisson arrivals, numbered after them
                    window = max(e.item.arrival_s for e in items)
                    items += encoded_long_items(o, self.encoder, window, seed=ri + 1000 * rep, first_index=len(items))
                load = f"rate={rate:.3g}"
                for c in rotated(configs, ri + rep):
                    run = await self._send("sweep", load, c, self._jobs(c, f"sweep{ri}", rep, items), senders,
                                           requests, "open")  # fmt: skip
                    self.log(f"sweep {load} req/s {c.name}: {run.wall_s:.1f} s")

    async def _bursty(self, configs: list[Config], senders, requests) -> None:
        o, rates = self.opts, self._rates()
        hi, lo = max(rates), min(rates)
        period = o.sweep_requests / (hi + lo / 4)  # about two on/off periods over the trace
        times = arrivals.on_off(hi, lo / 4, period, 0.5, o.sweep_requests, o.seed + 300)
        items = self._items(o.sweep_requests, None, o.sweep_max_new_tokens, seed_offset=300, times=times)
        load = f"on={hi:.3g},off={lo / 4:.3g},period={period:.3g}s"
        for rep in range(o.sweep_repeats):  # the same trace each time: repeats average out the machine's drift
            if o.sample_per_repeat and rep:  # the same arrivals, another prompt sample
                items = self._items(o.sweep_requests, None, o.sweep_max_new_tokens, times=times, own_sample=True,
                                    seed_offset=300 + sample_offset(o, rep))  # fmt: skip
            for c in rotated(configs, rep):
                run = await self._send("bursty", load, c, self._jobs(c, "bursty", rep, items), senders, requests,
                                       "open")  # fmt: skip
                self.log(f"bursty {load} {c.name}: {run.wall_s:.1f} s")

    def _share_rate(self) -> float:
        o = self.opts
        if o.share_rate is not None:
            return o.share_rate
        one = self.baseline_ttft_s + (o.sweep_max_new_tokens - 1) * self.baseline_tpot_ms / 1e3
        return o.share_rate_factor / one

    async def _shares(self, configs: list[Config], senders, requests) -> None:
        o, rate = self.opts, self._share_rate()
        for si, share in enumerate(o.stringent_shares):
            # the same arrivals and prompts for every share: only the SLO classes change
            items = self._items(o.sweep_requests, rate, o.sweep_max_new_tokens, seed_offset=200, slo_mix=share_mix(share))
            load = f"stringent={share:g}"
            for c in rotated(configs, si):
                run = await self._send("mix", load, c, self._jobs(c, f"mix{si}", 0, items), senders, requests,
                                       "open")  # fmt: skip
                self.log(f"mix {load} at {rate:.3g} req/s {c.name}: {run.wall_s:.1f} s")

    async def _closed(self, configs: list[Config], senders, requests) -> None:
        o = self.opts
        for rep in range(o.sweep_repeats):  # passes over the levels, the order of configurations rotated each time
            for ci, conc in enumerate(o.concurrency):
                # each (load, repeat) is its own sample of N requests, the same for every configuration within it:
                # all N are present at once, so what any order can gain over FCFS is a property of the sample
                # (bench/order_replay.py); one sample repeated would measure that draw, not the policy
                items = self._items(max(o.sweep_requests, o.closed_factor * conc), None, o.sweep_max_new_tokens,
                                    seed_offset=100 + ci + 50 * rep, own_sample=True)  # fmt: skip
                load = f"concurrency={conc}"
                for c in rotated(configs, ci + rep):
                    run = await self._send("closed", load, c, self._jobs(c, f"closed{ci}", rep, items), senders,
                                           requests, "closed", conc)  # fmt: skip
                    self.log(f"closed {load} {c.name}: {run.wall_s:.1f} s")

    # ------------------------------------------------------------------ results
    def _checkpoint(self) -> None:
        """results.json as measured so far, marked ``"partial": true``: a run stopped before its end (a
        GPU stage at its time budget, a crash, Ctrl-C an hour in) keeps every configuration it finished.
        run_bench overwrites it with the whole run's results. Written to a temporary file and renamed,
        so a run killed mid-write leaves the previous checkpoint, never half a file."""
        try:
            out = self._results(*self.configs)
            out["partial"] = True
            path = self.out_dir / "results.json"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
            tmp.replace(path)
        except Exception as exc:  # noqa: BLE001 - a checkpoint must never stop the measurement it saves
            self.log(f"[yellow]checkpoint not written: {type(exc).__name__}: {exc}")

    def _results(self, b1: list[Config], sw: list[Config]) -> dict:
        o = self.opts
        out: dict = {
            "name": o.name,
            "command": shlex.join(["python", "-m", "bench.harness", *sys.argv[1:]]),
            "machine": machine(o.threads),
            "commit": self.commit,
            "started_unix": self.t_start,
            "duration_s": time.time() - self.t_start,
            "pair": o.models.pair if o.models.target is None else "custom",
            "models": {"target": str(self.target_dir), "draft": o.stack_draft or (str(self.draft_dir) if self.draft_dir else None)},
            "options": jsonable(asdict(o)),
            "baseline_tpot_ms": self.baseline_tpot_ms,
            "workload": {
                "batch1": {"num_requests": len(self.b1_items), "repeats": o.repeats, "max_new_tokens": o.max_new_tokens,
                           "prompt_kinds": [e.item.prompt.kind for e in self.b1_items],
                           "prompt_tokens": [len(e.prompt_ids) for e in self.b1_items]},
                "sweep": {"requests_per_load": o.sweep_requests, "max_new_tokens": o.sweep_max_new_tokens,
                          "slo_mix": o.slo_mix, "prompt_mix": o.prompt_mix},
                "long_prompts": {"per_load": o.long_prompts, "prompt_tokens": o.long_prompt_tokens,
                                 "max_new_tokens": o.long_max_new_tokens, "lone_ttft_s": self.long_baseline_ttft_s,
                                 "ttft_slo_ms": self.long_ttft_slo_ms} if o.long_prompts else None,
                "mix": {"stringent_shares": o.stringent_shares,
                        "rate": self._share_rate() if o.stringent_shares and self.baseline_tpot_ms else None},
            },  # fmt: skip
            "token_budget": self.token_budget,
            "notes": self.notes,
        }
        b1_records = self.records["batch1"].get("batch=1", {})
        for recs in b1_records.values():  # SLOs known only now: the baseline was measured in this phase
            for r in recs:
                if self.baseline_tpot_ms is not None:  # None at a checkpoint before the baseline's run
                    r.trace.tpot_slo_ms = r.job.encoded.item.slo.tpot_ms(self.baseline_tpot_ms)
        out["batch1"] = {}
        for c in b1:
            recs = b1_records.get(c.name, [])
            if not recs:
                continue
            row = {"summary": report.summarize_records(recs, report.batch1_wall_s(recs)),
                   "by_run": report.by_run(recs, batch1=True)}
            row.update(self._extras("batch1", "batch=1", c.name))
            out["batch1"][c.name] = row
        tok = {n: r["summary"]["throughput_tok_s"] for n, r in out["batch1"].items()}
        for name, row in out["batch1"].items():
            for ref in ("target-only", "hf-assisted", "hf-target"):
                if ref in tok and name != ref:
                    key = ref.replace("-", "_")
                    row[f"speedup_vs_{key}"] = tok[name] / tok[ref]
                    row[f"paired_speedup_vs_{key}"] = report.paired_speedup(b1_records, name, ref)
            if "target-only" in b1_records and name != "target-only":
                row["lossless_vs_target_only"] = report.lossless(b1_records, name, "target-only")
        for phase in ("sweep", "closed", "mix", "bursty"):
            out[phase] = {}
            for load, per_config in self.records.get(phase, {}).items():
                out[phase][load] = {}
                for name, recs in per_config.items():
                    run_wall = self.walls[(phase, load, name)]
                    row = {"summary": report.summarize_records(recs, run_wall), "by_run": report.by_run(recs)}
                    for run in row["by_run"]:  # each run's step times by shape (its machine and its order together)
                        if steps := self.run_steps.get((phase, load, name), {}).get(run["repeat"]):
                            run["step_ms_by_batch_k"] = steps
                    row.update(self._extras(phase, load, name))
                    if phase == "closed":  # what an order policy moves: who waited, for how long, how long it ran
                        row["requests"] = report.request_rows(recs)
                    out[phase][load][name] = row
        return out

    def _extras(self, phase: str, load: str, name: str) -> dict:
        extra: dict = {"overhead": self.overheads.get((phase, load, name))}
        if runs := self.run_latency.get((phase, load, name)):
            extra["latency_mean_by_run_s"] = runs  # one per repeat: the spread the pooled mean hides
        delta = self.prom.get((phase, load, name))
        if delta:
            extra["per_position_acceptance"] = prom.per_position_acceptance(delta)
            if ks := prom.speculation_lengths(delta):
                extra["speculation_lengths"] = ks  # what a length policy chose, per request-step
            if (ee := prom.early_exit(delta)) is not None:
                extra["early_exit"] = ee
            if events := prom.memory_events(delta):
                extra["memory_events"] = events
            if events := prom.admission_events(delta):
                extra["admission_events"] = events  # what a queue policy's preemptions cost
            if chunks := prom.prefill_chunks(delta):
                extra["prefill_chunks"] = chunks  # chunked prefill ran (configurations chunk:<N>:...)
            if hits := prom.prefix_cache_hit_tokens(delta):
                extra["prefix_cache_hit_tokens"] = hits
        if timeline := self.timelines.get((phase, load, name)):
            extra["timeline"] = timeline
        return extra


def run_bench(opts: BenchOptions, out_dir: Path | None = None, console: Console | None = None) -> dict:
    """Run ``opts`` and write results.json + PNGs under ``out_dir`` (default bench/results/<name>)."""
    out_dir = out_dir or RESULTS_ROOT / opts.name
    out_dir.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    results = asyncio.run(Harness(opts, out_dir, console).run())
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    results["plots"] = [p.name for p in plots.all_plots(results, out_dir)]
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    results_readme.write(out_dir)  # command, machine, date, tables, plots: generated, never by hand
    report.print_tables(results, console)
    if adaptive_goals.applies(results):  # the adaptive-length goals: each policy against the best fixed k
        g = adaptive_goals.goals(results)
        (out_dir / "goals.json").write_text(json.dumps(g, indent=2) + "\n")
        console.print(adaptive_goals.table(g))
    console.print(f"results in {out_dir}")
    return results


if __name__ == "__main__":  # the CLI lives in bench/harness_cli.py, which imports this module (never the reverse)
    from bench.harness_cli import app

    app()
