"""Soak test with faults (`make soak`): N requests at concurrency C while the draft, the target and
Redis are killed and restarted at random moments; what was lost, what came out wrong, what leaked.

    launch (tandem up's launcher: Redis + three services on loopback)
    reference  every greedy prompt once, no faults            -> the outputs to compare against
    soak       N requests, C at a time, greedy and sampled, speculation off / fixed k / auto
               meanwhile: F kills of each kind (draft, target, redis), at random points of progress,
               each followed by a restart on the same port (the next fault waits until it serves)
    idle       scheduler queue and running set empty, target KV blocks all free, draft holds no sequence
    report     lost requests, greedy outputs that differ, RSS per service (start of soak -> end),
               p50/p99 latency, faults injected; JSON + README.md under bench/results/<name>/

A request is *lost* when its call fails or it ends with an error; *wrong* when a greedy request's
tokens differ from the fault-free reference. The scheduler is never killed: it is what must survive.
Prompts are token ids drawn from the target's vocabulary, so any pair (tiny or demo) works.
"""

from __future__ import annotations

import asyncio
import json
import platform
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import typer
from pydantic import BaseModel, Field

from sdk import AsyncClient, Client
from services.launcher import LaunchConfig, LaunchedStack, launch

FAULT_KINDS = ("draft", "target", "redis")
SPECULATION_MIX = ("off", 2, 4, "auto")
RESULTS = Path(__file__).resolve().parent / "results"


class SoakConfig(BaseModel):
    requests: int = Field(2000, ge=1)
    concurrency: int = Field(32, ge=1)
    faults_per_kind: int = Field(10, ge=0)
    kinds: tuple[str, ...] = FAULT_KINDS
    unique_prompts: int = Field(64, ge=1, description="Distinct greedy prompts (each has one reference output).")
    prompt_tokens: tuple[int, int] = (4, 24)
    max_new_tokens: tuple[int, int] = (4, 24)
    greedy_share: float = Field(0.5, ge=0.0, le=1.0)
    seed: int = 0
    request_timeout_s: float = 300.0


@dataclass
class Outcome:
    index: int
    greedy: bool
    ok: bool
    latency_s: float
    tokens: list[int] = field(default_factory=list)
    error: str = ""


@dataclass
class Job:
    index: int
    prompt: list[int]
    max_new_tokens: int
    greedy: bool
    speculation: object
    seed: int


def make_jobs(cfg: SoakConfig, vocab_size: int) -> tuple[list[Job], dict[int, tuple[list[int], int]]]:
    """The soak's requests and the distinct greedy prompts (key -> (prompt, max_new_tokens))."""
    rng = random.Random(cfg.seed)
    low = min(100, vocab_size // 4)  # skip the special ids at the start of real vocabularies
    pool = {
        k: ([rng.randrange(low, vocab_size) for _ in range(rng.randint(*cfg.prompt_tokens))],
            rng.randint(*cfg.max_new_tokens))
        for k in range(cfg.unique_prompts)
    }
    jobs = []
    for i in range(cfg.requests):
        greedy = rng.random() < cfg.greedy_share
        key = rng.randrange(cfg.unique_prompts)
        prompt, n = pool[key] if greedy else (
            [rng.randrange(low, vocab_size) for _ in range(rng.randint(*cfg.prompt_tokens))],
            rng.randint(*cfg.max_new_tokens))
        jobs.append(Job(i, prompt, n, greedy, SPECULATION_MIX[i % len(SPECULATION_MIX)], key if greedy else i))
    return jobs, pool


async def _run_one(client: AsyncClient, job: Job, timeout_s: float) -> Outcome:
    kwargs = {} if job.greedy else {"temperature": 0.8, "seed": job.seed}
    start = time.perf_counter()
    try:
        result = await client.generate(job.prompt, max_new_tokens=job.max_new_tokens, speculation=job.speculation,
                                       timeout=timeout_s, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a lost request is what this counts
        return Outcome(job.index, job.greedy, False, time.perf_counter() - start, error=f"{type(exc).__name__}: {exc}")
    ok = not result.error and len(result.token_ids) > 0
    return Outcome(job.index, job.greedy, ok, time.perf_counter() - start, list(result.token_ids), result.error)


async def run_jobs(address: str, jobs: list[Job], concurrency: int, timeout_s: float, progress=None) -> list[Outcome]:
    queue: asyncio.Queue[Job] = asyncio.Queue()
    for job in jobs:
        queue.put_nowait(job)
    outcomes: list[Outcome] = []

    async def worker(client: AsyncClient) -> None:
        while not queue.empty():
            outcome = await _run_one(client, queue.get_nowait(), timeout_s)
            outcomes.append(outcome)
            if progress is not None:
                progress(len(outcomes))

    async with AsyncClient(address, wait_for_ready=True) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return sorted(outcomes, key=lambda o: o.index)


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class FaultInjector:
    """Kills and restarts services at random points of the soak's progress (counted in finished requests)."""

    def __init__(self, stack: LaunchedStack, cfg: SoakConfig) -> None:
        self.stack = stack
        rng = random.Random(cfg.seed + 1)
        plan = [k for k in cfg.kinds for _ in range(cfg.faults_per_kind)]
        rng.shuffle(plan)
        # evenly spread over the middle 90 % of the run, jittered
        n = len(plan)
        span = cfg.requests * 0.9
        self.points = sorted(int(cfg.requests * 0.05 + span * (i + rng.random()) / max(n, 1)) for i in range(n))
        self.plan = plan
        self.done: list[dict] = []
        self._next = 0
        self._busy = False

    def maybe_fire(self, finished: int) -> None:
        if self._busy or self._next >= len(self.plan) or finished < self.points[self._next]:
            return
        kind = self.plan[self._next]
        self._next += 1
        self._busy = True
        asyncio.get_running_loop().create_task(self._fire(kind, finished))

    async def _fire(self, kind: str, finished: int) -> None:
        start = time.perf_counter()
        try:
            if kind == "redis":
                await asyncio.to_thread(self.stack.restart_redis)
            else:
                await asyncio.to_thread(self.stack.restart, kind, 600.0)
            self.done.append({"kind": kind, "at_request": finished, "restart_s": round(time.perf_counter() - start, 2)})
        except Exception as exc:  # noqa: BLE001 - reported, the soak goes on
            self.done.append({"kind": kind, "at_request": finished, "error": str(exc)})
        finally:
            self._busy = False

    async def finish(self) -> None:
        while self._busy:
            await asyncio.sleep(0.05)


def wait_idle(stack: LaunchedStack, timeout_s: float = 60.0) -> dict:
    """Poll until nothing is queued, running or holding KV; returns what was seen last."""
    deadline = time.monotonic() + timeout_s
    with Client(stack.endpoints.scheduler, timeout=10) as client:
        while True:
            info = client.info()
            target, draft = info.target, info.draft
            seen = {
                "num_running": info.num_running,
                "num_waiting": info.num_waiting,
                "target_kv_blocks_free": target.kv_blocks_free if target else None,
                "target_kv_blocks_total": target.kv_blocks_total if target else None,
                "target_live_seqs": target.num_live_seqs if target else None,
                "draft_live_seqs": draft.num_live_seqs if draft else None,
            }
            idle = (info.num_running == 0 and info.num_waiting == 0 and target is not None
                    and target.kv_blocks_free == target.kv_blocks_total and target.num_live_seqs == 0
                    and (draft is None or draft.num_live_seqs == 0))
            if idle or time.monotonic() > deadline:
                return seen | {"idle": idle}
            time.sleep(0.2)


async def soak(stack: LaunchedStack, cfg: SoakConfig, log=print) -> dict:
    address = stack.endpoints.scheduler
    with Client(address, timeout=30) as client:
        vocab = client.info().target.vocab_size
    jobs, pool = make_jobs(cfg, vocab)
    greedy_keys = sorted({j.seed for j in jobs if j.greedy})
    ref_jobs = [Job(k, pool[k][0], pool[k][1], True, "off", k) for k in greedy_keys]
    log(f"reference: {len(ref_jobs)} greedy prompts, no faults")
    ref = {o.index: o for o in await run_jobs(address, ref_jobs, cfg.concurrency, cfg.request_timeout_s)}
    bad_ref = [k for k, o in ref.items() if not o.ok]
    if bad_ref:
        raise RuntimeError(f"the fault-free reference failed for prompts {bad_ref[:5]}: {ref[bad_ref[0]].error}")

    pids = {role: proc.pid for role, proc in stack.processes.items()}
    rss_start = {role: rss_kib(pid) for role, pid in pids.items()}
    injector = FaultInjector(stack, cfg)
    log(f"soak: {cfg.requests} requests at concurrency {cfg.concurrency}, faults {len(injector.plan)}")
    started = time.perf_counter()
    last_log = [0.0]

    def progress(finished: int) -> None:
        injector.maybe_fire(finished)
        if time.perf_counter() - last_log[0] > 10:
            last_log[0] = time.perf_counter()
            log(f"  {finished}/{cfg.requests} done, {len(injector.done)} faults injected")

    outcomes = await run_jobs(address, jobs, cfg.concurrency, cfg.request_timeout_s, progress)
    await injector.finish()
    wall_s = time.perf_counter() - started
    idle = await asyncio.to_thread(wait_idle, stack)
    rss_end = {role: rss_kib(proc.pid) for role, proc in stack.processes.items()}

    lost = [o for o in outcomes if not o.ok]
    wrong = [o for o in outcomes if o.ok and o.greedy and o.tokens != ref[jobs[o.index].seed].tokens]
    latencies = sorted(o.latency_s for o in outcomes if o.ok)
    faults = {k: sum(1 for f in injector.done if f["kind"] == k and "error" not in f) for k in cfg.kinds}
    sched_growth = None
    if rss_start.get("scheduler") and rss_end.get("scheduler"):
        sched_growth = rss_end["scheduler"] / rss_start["scheduler"] - 1
    return {
        "config": cfg.model_dump(),
        "requests": len(outcomes),
        "greedy": sum(o.greedy for o in outcomes),
        "lost": len(lost),
        "wrong_greedy": len(wrong),
        "lost_examples": [asdict(o) | {"tokens": o.tokens[:8]} for o in lost[:5]],
        "wrong_examples": [o.index for o in wrong[:10]],
        "faults": faults,
        "fault_log": injector.done,
        "rss_kib_start": rss_start,
        "rss_kib_end": rss_end,
        "restarted": {k: k in faults and faults[k] > 0 for k in ("draft", "target")},
        "scheduler_rss_growth": sched_growth,
        "idle_at_end": idle,
        "latency_s": {
            "p50": statistics.median(latencies) if latencies else None,
            "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
        },
        "wall_s": round(wall_s, 1),
        "tokens": sum(len(o.tokens) for o in outcomes),
    }


def passed(report: dict, max_rss_growth: float = 0.10) -> bool:
    growth = report["scheduler_rss_growth"]
    return (report["lost"] == 0 and report["wrong_greedy"] == 0 and report["idle_at_end"]["idle"]
            and (growth is None or growth < max_rss_growth))


def write_results(report: dict, name: str, command: str) -> Path:
    out = RESULTS / name
    out.mkdir(parents=True, exist_ok=True)
    from bench.run_info import cpu_model, git_commit

    meta = {"command": command, "machine": f"{cpu_model() or platform.node()} ({platform.machine()}, {_cores()} cores)",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit()}
    (out / "soak.json").write_text(json.dumps(meta | report, indent=2) + "\n")
    (out / "README.md").write_text(render(meta, report))
    return out


def _cores() -> int:
    import os

    return os.cpu_count() or 0


def render(meta: dict, r: dict) -> str:
    cfg = r["config"]
    lat = r["latency_s"]
    rows = [
        ("requests (greedy)", f"{r['requests']} ({r['greedy']})"),
        ("concurrency", cfg["concurrency"]),
        ("faults injected", ", ".join(f"{k} {v}" for k, v in r["faults"].items())),
        ("lost requests", r["lost"]),
        ("greedy outputs differing from the fault-free reference", r["wrong_greedy"]),
        ("scheduler RSS growth", "n/a" if r["scheduler_rss_growth"] is None else f"{r['scheduler_rss_growth']:+.1%}"),
        ("idle at the end (queue, KV, draft)", r["idle_at_end"]["idle"]),
        ("latency p50 / p99", f"{lat['p50']:.2f} s / {lat['p99']:.2f} s" if lat["p50"] is not None else "n/a"),
        ("wall time", f"{r['wall_s']} s"),
        ("verdict", "PASS" if passed(r) else "FAIL"),
    ]
    lines = [f"# Soak with faults: {meta['date']}", "", f"Command: `{meta['command']}`  ", f"Machine: {meta['machine']}  ",
             f"Commit: {meta.get('commit') or 'unknown'}",
             "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "",
             "RSS (KiB) per service at the start of the soak and at the end (draft and target are restarted "
             "processes: their figures are of the last incarnation):", "", "| service | start | end |", "|---|---|---|",
             *(f"| {k} | {r['rss_kib_start'].get(k)} | {r['rss_kib_end'].get(k)} |" for k in r["rss_kib_start"]), "",
             "Faults (kind, at which finished request, restart time):", "",
             *(f"- {f['kind']} at {f['at_request']}: " + (f"{f['restart_s']} s" if "restart_s" in f else f["error"])
               for f in r["fault_log"]), ""]
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


@app.command()
def main(
    pair: str = typer.Option("demo", help="Model pair (tandem models list)."),
    target: str | None = typer.Option(None, help="Target model path (overrides the pair's)."),
    draft: str | None = typer.Option(None, help="Draft model path or ngram/suffix spec (overrides the pair's)."),
    requests: int = typer.Option(2000),
    concurrency: int = typer.Option(32),
    faults: int = typer.Option(10, help="Faults of each kind (draft, target, redis)."),
    max_new_tokens: str = typer.Option("4-24", help="Output length range."),
    seed: int = typer.Option(0),
    name: str = typer.Option("", help="Results folder under bench/results/ (default soak-<pair>)."),
    home: Path | None = typer.Option(None),
) -> None:
    import sys

    low, high = (int(x) for x in max_new_tokens.split("-"))
    cfg = SoakConfig(requests=requests, concurrency=concurrency, faults_per_kind=faults, max_new_tokens=(low, high),
                     seed=seed)
    launch_cfg = LaunchConfig(pair=pair, home=home, target_model=target, draft_model=draft, port=0, metrics_port=None,
                              speculation_policy="fixed:3")
    with launch(launch_cfg) as stack:
        report = asyncio.run(soak(stack, cfg))
    out = write_results(report, name or f"soak-{pair}", "python -m bench.soak " + " ".join(sys.argv[1:]))
    print((out / "README.md").read_text())
    raise typer.Exit(0 if passed(report) else 1)


if __name__ == "__main__":
    app()
