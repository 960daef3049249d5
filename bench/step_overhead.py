"""Per-step orchestration of the deployed scheduler, unary RPCs vs step streams: ``python -m bench.step_overhead``.

The real scheduler (services/scheduler/main.py: loop, policies, Redis recorder, metrics, traces) in this
process; target and draft as separate processes serving zero-cost engines through the real servicers
and EngineHost (bench/zero_cost_service.py), over gRPC on loopback. A step costs what moving it costs::

    orchestration = step wall time (start to start) - the slowest worker's compute (engine time per step)

with the step wall time the mean over the steady steps (a median would read the fast half of steps whose
outcomes come two to a message, services/target/outcome_hold.py, or whose continuation was already in),

for plain decode (no draft), a chain of 4 and a 6-node tree (SpecInfer expansion 2-2), at batch 1, 8 and
64, and a chain of 4 with EAGLE features of 3 layers of hidden 576 and 4096 at batch 1 and 32. Each case
runs with ``TANDEM_WORKER_PROTOCOL=unary`` and ``=stream`` side by side, interleaved, in every repeat
(plain decode over streams with the default decode run-ahead: services/scheduler/run_ahead.py).
Also per step: message bytes through the scheduler, and overlap: the share of the scheduler's own
per-step work (commit + the deferrable observers: Redis, metrics) that ran beside the next step's worker
calls (scheduler/observer_calls.py). ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from shared.gc_freeze import freeze_after_startup

SHAPES = {"decode": "none", "chain4": "fixed:4", "tree6": "specinfer:2-2"}
TOKENS_PER_STEP = {"decode": 1, "chain4": 5, "tree6": 3}  # the zero-cost target accepts the first-child path
LAYERS = "2,16,29"
PROMPT = list(range(1, 33))
PROTOCOLS = ("unary", "stream")


def default_cases() -> list[tuple[str, int, int]]:
    plain = [(shape, batch, 0) for shape in SHAPES for batch in (1, 8, 64)]
    return plain + [("chain4", batch, width) for width in (576, 4096) for batch in (1, 32)]


class Services:
    """The model service processes: a target per hidden size, a plain draft and a feature draft per size."""

    def __init__(self, widths: set[int]) -> None:
        from shared.free_ports import free_ports

        self.procs: list[subprocess.Popen] = []
        self.addr: dict[tuple[str, int], str] = {}
        wanted = [("target", w) for w in sorted(widths | {576}) if w] + [("draft", 0)]
        wanted += [("draft", w) for w in sorted(widths) if w]
        for (role, width), port in zip(wanted, free_ports("127.0.0.1", len(wanted))):
            env = os.environ | {"TANDEM_PORT": str(port), "TANDEM_LOG_LEVEL": "warning", "TANDEM_THREADS": "1"}
            layers = LAYERS if role == "draft" and width else ""
            args = [sys.executable, "-m", "bench.zero_cost_service", role, str(width or 576), layers]
            self.procs.append(subprocess.Popen(args, env=env))
            self.addr[(role, width)] = f"127.0.0.1:{port}"

    def target(self, width: int) -> str:
        return self.addr[("target", width or 576)]

    def draft(self, width: int) -> str:
        return self.addr[("draft", width)]

    async def wait(self) -> None:
        for address in self.addr.values():
            await self.info(address, wait_s=600)

    async def info(self, address: str, wait_s: float = 2.0):
        from services.scheduler.grpc_workers import GrpcDraftWorker, GrpcTargetWorker

        role = next(role for (role, _), a in self.addr.items() if a == address)
        worker = (GrpcTargetWorker if role == "target" else GrpcDraftWorker)(address)
        try:
            return await worker.info(wait_s=wait_s)
        finally:
            await worker.close()

    async def work_ns(self, address: str) -> int:
        name = (await self.info(address)).model_name  # "zero-cost work_ns=N calls=M"
        return int(name.split("work_ns=")[1].split()[0])

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _worker(wrapper, attr: str):
    """The gRPC worker under the scheduler's wrappers (TracedTarget/TracedDraft, StepLedger)."""
    while wrapper is not None and not hasattr(wrapper, "wire_bytes"):
        wrapper = getattr(wrapper, attr)
    return wrapper


class StepLog:
    """An observer: per step its start, batch, prefills, bytes moved so far, and the scheduler's own work."""

    def __init__(self, workers, deferred) -> None:
        self.workers = [w for w in workers if w is not None]
        self.deferred = deferred  # the loop's DeferredCalls: observers run beside the next step's worker calls
        self.rows: list[tuple[float, int, int, int, float, float]] = []

    def on_step(self, report) -> None:
        wire = sum(w.wire_bytes() for w in self.workers)
        self.rows.append((report.started_at, report.batch_size, len(report.prefilled_ids), wire,
                          report.times.commit, self.deferred.busy_s))  # fmt: skip

    def on_finish(self, request) -> None:
        return None


async def start_scheduler(services: Services, protocol: str, shape: str, width: int, redis_url: str, home: str):
    from services.scheduler.main import start
    from services.settings import ServiceSettings

    settings = ServiceSettings(
        port=0, home=home, model="zero-cost-target", target_addr=services.target(width),
        draft_addr="none" if shape == "decode" else services.draft(width), redis_url=redis_url,
        speculation_policy=SHAPES[shape], max_batch_size=64, worker_protocol=protocol, log_level="warning",
    )  # fmt: skip
    return await start(settings)


async def run_case(running, services: Services, tag: str, shape: str, batch: int, width: int, steps: int) -> dict:
    from scheduler.request import Request

    sched = running.scheduler
    target, draft = _worker(sched.target, "target"), _worker(sched.draft, "draft")
    log = StepLog([target, draft], sched.deferred)
    sched.add_observer(log)
    addrs = [services.target(width)] + ([services.draft(width)] if draft is not None else [])
    before = [await services.work_ns(a) for a in addrs]
    warm = 3
    max_new = TOKENS_PER_STEP[shape] * (steps + warm + 2)
    reqs = [Request(id=f"{tag}-{i}", prompt_ids=PROMPT, max_new_tokens=max_new) for i in range(batch)]
    t0 = time.perf_counter()
    await asyncio.gather(*(sched.submit(r).collect() for r in reqs))
    wall = time.perf_counter() - t0
    sched.observers.remove(log)
    after = [await services.work_ns(a) for a in addrs]
    num_steps = max(1, len(log.rows))
    compute_s = max((b - a) for a, b in zip(before, after)) / 1e9 / num_steps
    steady = [i for i, r in enumerate(log.rows) if r[1] == batch and r[2] == 0 and i > 0][warm:]
    steady_set = set(steady)
    pairs = [(log.rows[i - 1], log.rows[i]) for i in steady if i - 1 in steady_set]
    step_s = sum(b[0] - a[0] for a, b in pairs) / len(pairs)  # the mean: outcomes may come two to a message
    wire = statistics.median(b[3] - a[3] for a, b in pairs)
    hidden = log.rows[steady[-1]][5] - log.rows[steady[0]][5]  # deferred observer time over the steady steps
    own = sum(log.rows[i][4] for i in steady) + hidden  # the scheduler's own per-step work: commit + observers
    return {"step_ms": step_s * 1e3, "compute_ms": compute_s * 1e3, "orchestration_ms": (step_s - compute_s) * 1e3,
            "scheduler_bytes_per_step": wire, "overlap": hidden / own if own else 0.0, "steps": len(log.rows),
            "run_s": wall}  # fmt: skip


async def run(cases: list[tuple[str, int, int]], repeats: int, steps: int, log=print) -> list[dict]:
    from shared.state.redis_server import start_redis

    services = Services({w for _, _, w in cases})
    redis_server = await asyncio.to_thread(start_redis)
    home = tempfile.mkdtemp(prefix="tandem-step-overhead-")
    schedulers: dict[tuple[str, str, int], object] = {}
    results: dict[tuple[str, str, int, int], list[dict]] = {}
    try:
        await services.wait()
        for protocol in PROTOCOLS:
            for shape, _, width in cases:
                if (protocol, shape, width) not in schedulers:
                    schedulers[(protocol, shape, width)] = await start_scheduler(
                        services, protocol, shape, width, redis_server.url, home)
        freeze_after_startup()  # as the scheduler's own entry point does once it serves (shared/gc_freeze.py)
        n = 0
        for rep in range(repeats):
            for shape, batch, width in cases:
                order = PROTOCOLS if (rep + n) % 2 == 0 else PROTOCOLS[::-1]  # who goes first alternates
                n += 1
                for protocol in order:
                    out = await run_case(schedulers[(protocol, shape, width)], services, f"r{rep}-{n}-{protocol}",
                                         shape, batch, width, steps)  # fmt: skip
                    results.setdefault((protocol, shape, batch, width), []).append(out)
                    log(f"repeat {rep + 1}: {protocol:6s} {shape:6s} B={batch:<3d} features={width:<4d} "
                        f"orchestration {out['orchestration_ms']:.3f} ms, {out['scheduler_bytes_per_step']:.0f} B/step",
                        file=sys.stderr)  # fmt: skip
    finally:
        for running in schedulers.values():
            await running.stop(0)
        services.stop()
        await asyncio.to_thread(redis_server.stop)
    return [_row(key, runs) for key, runs in results.items()]


def _row(key: tuple[str, str, int, int], runs: list[dict]) -> dict:
    protocol, shape, batch, width = key
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {"protocol": protocol, "shape": shape, "batch": batch, "feature_width": width,
            "orchestration_ms": med["orchestration_ms"],
            "orchestration_ms_repeats": [r["orchestration_ms"] for r in runs],
            "step_ms": med["step_ms"], "compute_ms": med["compute_ms"],
            "scheduler_bytes_per_step": med["scheduler_bytes_per_step"], "overlap": med["overlap"]}  # fmt: skip


def goal(row: dict, unary: dict | None) -> str:
    """The goal a stream row is held to: an absolute bound and at most 1/3 of the unary row of the same case,
    in every repeat (each repeat's stream run against the unary run interleaved with it), not only the median."""
    if row["protocol"] != "stream" or unary is None:
        return ""
    bound = 2.0 if row["batch"] >= 64 else 0.5 if row["shape"] == "decode" else 0.8
    if row["feature_width"]:
        bound = None
    pairs = list(zip(row["orchestration_ms_repeats"], unary["orchestration_ms_repeats"]))
    ratios = [s / u if u > 0 else float("inf") for s, u in pairs]
    met = sum(r <= 1 / 3 and (bound is None or s <= bound) for r, (s, _) in zip(ratios, pairs))
    ratio = row["orchestration_ms"] / unary["orchestration_ms"] if unary["orchestration_ms"] > 0 else float("inf")
    verdict = "met" if met == len(pairs) else f"not met ({met} of {len(pairs)} repeats)" if met else "not met"
    return f"{ratio:.2f}x of unary; {verdict}" + (f" (<= {bound} ms, <= 1/3)" if bound else " (<= 1/3)")


def table(meta: dict, rows: list[dict]) -> list[str]:
    lines = [f"`{meta['command']}` ({meta['machine']}, {meta['date']}, commit {meta['commit']})", "",
             "| protocol | shape | B | features | orchestration ms (median) | per repeat | step ms | compute ms "
             "| bytes/step | overlap | goal |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    by_key = {(r["protocol"], r["shape"], r["batch"], r["feature_width"]): r for r in rows}
    for r in sorted(rows, key=lambda r: (r["feature_width"], r["shape"], r["batch"], r["protocol"] != "unary")):
        unary = by_key.get(("unary", r["shape"], r["batch"], r["feature_width"]))
        lines.append(f"| {r['protocol']} | {r['shape']} | {r['batch']} | {r['feature_width'] or '-'} "
                     f"| {r['orchestration_ms']:.3f} | {', '.join(f'{x:.3f}' for x in r['orchestration_ms_repeats'])} "
                     f"| {r['step_ms']:.3f} | {r['compute_ms']:.3f} | {r['scheduler_bytes_per_step']:.0f} "
                     f"| {r['overlap']:.0%} | {goal(r, unary)} |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per run (after 3 warm-up steps)")
    parser.add_argument("--cases", default="", help="shape:batch[:width],... (default: the full matrix)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", default="", help="write results.json and README.md to this folder")
    args = parser.parse_args(argv)
    cases = default_cases()
    if args.cases:
        cases = [(p[0], int(p[1]), int(p[2]) if len(p) > 2 else 0) for p in (c.split(":") for c in args.cases.split(","))]
    from shared.event_loop import run_loop

    rows = run_loop(run(cases, args.repeats, args.steps))  # the scheduler's loop, as deployed
    from bench.run_info import cpu_model

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"command": "python -m bench.step_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{cpu_model() or 'CPU'}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit}  # fmt: skip
    if args.out:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "results.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
        (folder / "README.md").write_text("\n".join(["# Per-step orchestration: unary RPCs vs step streams", "",
                                                     *table(meta, rows)]) + "\n")  # fmt: skip
    if args.json:
        print(json.dumps({**meta, "rows": rows}, indent=1))
    else:
        print("\n".join(table(meta, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
