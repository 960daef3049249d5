"""`python -m bench.prefill`: chunked prefill and automatic prefix caching on the demo pair, on this machine.

Two benchmarks, configurations interleaved within each repeat (so machine contention hits both alike),
the scheduler loop over in-process engines (LocalTargetWorker / LocalDraftWorker, real models)::

    tpot    4 requests decode (short prompts, long outputs); 2,000-token prompts arrive every few seconds.
            p99 of the running requests' inter-token gaps while the long prompts prefill, and the long
            prompts' TTFT: chunked (TANDEM_PREFILL_CHUNK tokens per step, in the verify forward) vs one-piece.
    cache   a 5-turn chat and a 10-step agent loop (each turn's prompt = the history so far + a new message
            or tool result); TTFT of every turn with the prefix cache on vs off, the target's hit rate.

Prompts are random token ids (the compute of a prefill does not depend on which tokens).
Results: bench/results/serving-demo/prefill/ (results.json + README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path

from bench.prefill_readme import load_now, readme

MODELS = Path.home() / ".cache/tandem/models"
OUT = Path(__file__).parent / "results/serving-demo/prefill"


def engines(block_size: int = 16, num_blocks: int = 1024):
    from shared.engine.config import EngineConfig
    from shared.engine.factory import build_draft_engine, build_target_engine

    config = EngineConfig(block_size=block_size, num_blocks=num_blocks)
    target, _ = build_target_engine(MODELS / "smollm2-135m-instruct", device="cpu", engine_config=config,
                                    with_tokenizer=False)  # fmt: skip
    draft, _ = build_draft_engine(MODELS / "smollm2-draft", device="cpu", engine_config=config.model_copy(),
                                  with_tokenizer=False)  # fmt: skip
    return target, draft


def scheduler(target, draft, *, chunk: int, spec_k: int):
    from scheduler.engine_loop import Scheduler, SchedulerConfig
    from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
    from scheduler.policies.speculation import FixedChain, NoSpeculation

    policy = FixedChain(spec_k) if spec_k else NoSpeculation()
    return Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=policy,
                     config=SchedulerConfig(prefill_chunk=chunk, max_tokens_in_flight=1 << 15))  # fmt: skip


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def reset_cache(*engs) -> None:
    for e in engs:
        e.runner.cache.allocator.drop_cache()


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


# ---------------------------------------------------------------------- tpot: long prompts arriving
async def _tpot_run(sched, rng, *, long_tokens: int, arrivals: list[float], decode_tokens: int, tag: str):
    from scheduler.request import Request

    running = [Request(f"{tag}run{i}", tokens(rng, 24), max_new_tokens=decode_tokens) for i in range(4)]
    longs = [Request(f"{tag}long{i}", tokens(rng, long_tokens), max_new_tokens=4) for i in range(len(arrivals))]
    loop_task = asyncio.create_task(sched.run())
    streams = [sched.submit(r) for r in running]
    while not all(r.output_ids for r in running):  # every running request decodes before the first arrival
        await asyncio.sleep(0.01)
    t0 = time.monotonic()
    long_streams = []
    for at, req in zip(arrivals, longs):
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        long_streams.append(sched.submit(req))
    await asyncio.gather(*(s.collect() for s in long_streams))
    window = (longs[0].arrival_time, max(r.first_token_time for r in longs))
    for r in running:
        sched.abort(r.id)
    await asyncio.gather(*(s.collect() for s in streams))
    await _drain(sched, loop_task)
    # every gap that overlaps the window from the first long arrival to the last long's first token
    gaps = [b - a for r in running for a, b in zip(r.token_times, r.token_times[1:]) if a < window[1] and b > window[0]]
    return {"p99_tpot_s": quantile(gaps, 0.99), "max_gap_s": max(gaps), "mean_gap_s": statistics.mean(gaps),
            "ttft_s": [r.ttft for r in longs], "num_gaps": len(gaps)}  # fmt: skip


def bench_tpot(target, draft, args) -> dict:
    configs = {"chunked": args.chunk, "one-piece": 0}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for rep in range(args.repeats):
        for name, chunk in configs.items():
            reset_cache(target, draft)  # every run prefills its long prompts cold
            rng = random.Random(rep)  # the same prompts for both configurations
            sched = scheduler(target, draft, chunk=chunk, spec_k=args.spec_k)
            arrivals = [i * args.every_s for i in range(args.num_long)]
            out = asyncio.run(_tpot_run(sched, rng, long_tokens=args.long_tokens, arrivals=arrivals,
                                        decode_tokens=1500, tag=f"{name}-{rep}-"))  # fmt: skip
            runs[name].append(out)
            print(f"tpot rep {rep} {name:9s} p99 gap {out['p99_tpot_s'] * 1e3:7.0f} ms  max {out['max_gap_s'] * 1e3:7.0f} ms"
                  f"  TTFT {', '.join(f'{t:.2f}' for t in out['ttft_s'])} s", flush=True)
    ratio = [o["p99_tpot_s"] / c["p99_tpot_s"] for o, c in zip(runs["one-piece"], runs["chunked"])]
    ttft = [statistics.mean(c["ttft_s"]) / statistics.mean(o["ttft_s"]) for o, c in zip(runs["one-piece"], runs["chunked"])]
    return {"runs": runs, "p99_tpot_ratio_one_piece_over_chunked": ratio, "ttft_ratio_chunked_over_one_piece": ttft}


# ---------------------------------------------------------------------- cache: multi-turn workloads
async def _turns(sched, rng, *, system: int, turns: int, message: int, output: int, tag: str) -> list[float]:
    from scheduler.request import Request

    loop_task = asyncio.create_task(sched.run())
    history = tokens(rng, system)
    ttfts = []
    for turn in range(turns):
        history = history + tokens(rng, message)
        req = Request(f"{tag}{turn}", list(history), max_new_tokens=output)
        out = await sched.submit(req).collect()
        ttfts.append(req.ttft)
        history = history + out
    await _drain(sched, loop_task)
    return ttfts


async def _drain(sched, loop_task) -> None:
    """Let the loop release what ended on the engines, then stop it."""
    while sched.has_work():
        await asyncio.sleep(0.01)
    sched.stop()
    await loop_task


WORKLOADS = {  # name: (system prompt tokens, turns, new tokens per turn, output tokens per turn)
    "chat-5-turns": (300, 5, 60, 16),
    "agent-10-steps": (500, 10, 80, 12),
}


def bench_cache(target, draft, args) -> dict:
    out: dict[str, dict] = {}
    for workload, (system, turns, message, output) in WORKLOADS.items():
        runs: dict[str, list] = {"cache": [], "no-cache": []}
        hit_rates = []
        for rep in range(args.repeats):
            for name in runs:
                for e in (target, draft):
                    e.runner.config.prefix_caching = name == "cache"
                reset_cache(target, draft)
                index = target.runner.cache.allocator.prefix
                before = (index.hits, index.queries)
                sched = scheduler(target, draft, chunk=args.chunk, spec_k=args.spec_k)
                ttfts = asyncio.run(_turns(sched, random.Random(100 + rep), system=system, turns=turns,
                                           message=message, output=output, tag=f"{workload}-{name}-{rep}-"))  # fmt: skip
                runs[name].append(ttfts)
                if name == "cache":
                    hit_rates.append((index.hits - before[0]) / max(1, index.queries - before[1]))
                print(f"{workload} rep {rep} {name:8s} TTFT ms " + " ".join(f"{t * 1e3:.0f}" for t in ttfts), flush=True)
        later = [statistics.mean(n[1:]) / statistics.mean(c[1:]) for n, c in zip(runs["no-cache"], runs["cache"])]
        out[workload] = {"runs": runs, "later_turn_ttft_ratio_no_cache_over_cache": later,
                         "target_hit_rate": hit_rates}  # fmt: skip
    for e in (target, draft):
        e.runner.config.prefix_caching = True
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--long-tokens", type=int, default=2000)
    p.add_argument("--num-long", type=int, default=2)
    p.add_argument("--every-s", type=float, default=4.0)
    p.add_argument("--spec-k", type=int, default=3)
    p.add_argument("--only", choices=["tpot", "cache"], default=None)
    args = p.parse_args()
    target, draft = engines()
    started = time.time()
    results = {"args": vars(args)}
    if args.only in (None, "tpot"):
        results["tpot"] = bench_tpot(target, draft, args)
    if args.only in (None, "cache"):
        results["cache"] = bench_cache(target, draft, args)
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results["run"] = {
        "command": "python -m bench.prefill " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                        if v is not None),
        "machine": f"{platform.platform()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "duration_s": round(time.time() - started),
        "commit": commit,
        "load": load_now(),
    }  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    name = "results.json" if args.only is None else f"results-{args.only}.json"
    (OUT / name).write_text(json.dumps(results, indent=1))
    if args.only is None:
        (OUT / "README.md").write_text(readme(results))
    print(json.dumps({k: v for k, v in results.items() if k != "tpot" and k != "cache"}, indent=1))
    if "tpot" in results:
        t = results["tpot"]
        print("p99 TPOT one-piece / chunked:", [round(x, 2) for x in t["p99_tpot_ratio_one_piece_over_chunked"]],
              " TTFT chunked / one-piece:", [round(x, 2) for x in t["ttft_ratio_chunked_over_one_piece"]])
    for w, c in results.get("cache", {}).items():
        print(f"{w}: later-turn TTFT no-cache / cache:", [round(x, 2) for x in c["later_turn_ttft_ratio_no_cache_over_cache"]],
              " hit rate:", [round(x, 3) for x in c["target_hit_rate"]])


if __name__ == "__main__":
    main()
