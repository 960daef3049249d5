"""`make bench-http`: what the OpenAI-compatible HTTP API costs per token against the gRPC endpoint.

One stack (`tandem up --http-port`), the same greedy requests sent both ways, interleaved:

    batch 1      each prompt over gRPC (SDK stream) then over HTTP (SSE, httpx), order alternating,
                 ``repeats`` passes: client-side time per output token after the first (TPOT) and latency
    under load   closed loop at ``concurrency``, gRPC and HTTP passes alternating: tokens/s, mean latency

Both ends stream, so the per-token figure includes SSE framing and JSON encoding on the HTTP side and
protobuf on the gRPC side. Speculation is off: the figure is the transport's, not the draft's.
Results: bench/results/http-<pair>/{http.json,README.md}.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import typer

from bench.harness import machine
from bench.prompts import load
from bench.stack import Models
from bench.tokens import PromptEncoder
from sdk import AsyncClient
from services.launcher import LaunchConfig, launch

RESULTS = Path(__file__).resolve().parent / "results"


async def _grpc(client: AsyncClient, text: list[int], n: int) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    stamps = []
    async with client.stream(text, max_new_tokens=n, speculation="off") as stream:
        async for ev in stream:
            stamps += [time.perf_counter()] * len(ev.token_ids)
    return _timing(t0, stamps)


async def _http(http: httpx.AsyncClient, text: list[int], n: int) -> tuple[float, float, int]:
    body = {"prompt": text, "max_tokens": n, "temperature": 0, "stream": True, "speculation": "off"}
    t0 = time.perf_counter()
    stamps = []
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    stamps.append(time.perf_counter())
    return _timing(t0, stamps)


def _timing(t0: float, stamps: list[float]) -> tuple[float, float, int]:
    """(latency s, time per chunk after the first s, chunks)."""
    end = stamps[-1] if stamps else time.perf_counter()
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return end - t0, tpot, len(stamps)


async def measure(grpc_addr: str, http_url: str, target_dir: Path, *, prompts: int, repeats: int, max_tokens: int,
                  concurrency: int, load_requests: int) -> dict:  # fmt: skip
    # chat prompts through the target's chat template, sent as the same token ids both ways
    encoder = PromptEncoder.for_model(target_dir)
    texts = [list(encoder.encode(p.text, p.messages())) for p in load("chat", prompts, seed=3)]
    out: dict = {"batch1": {"grpc": [], "http": []}, "load": {"grpc": [], "http": []}}
    async with AsyncClient(grpc_addr, timeout=600) as client, httpx.AsyncClient(base_url=http_url, timeout=600) as http:
        send = {"grpc": lambda t: _grpc(client, t, max_tokens), "http": lambda t: _http(http, t, max_tokens)}
        for name in send:  # warm-up
            await send[name](texts[0])
        for rep in range(repeats):
            for i, text in enumerate(texts):
                order = ("grpc", "http") if (i + rep) % 2 == 0 else ("http", "grpc")
                for name in order:
                    out["batch1"][name].append(await send[name](text))
        for rep in range(repeats):
            for name in (("grpc", "http") if rep % 2 == 0 else ("http", "grpc")):
                queue = [texts[j % len(texts)] for j in range(load_requests)]
                results = []

                async def worker() -> None:
                    while queue:
                        results.append(await send[name](queue.pop()))

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                wall = time.perf_counter() - t0
                tokens = sum(r[2] for r in results)
                out["load"][name].append({"tok_s": tokens / wall, "latency_s": statistics.fmean(r[0] for r in results)})
    return out


def summarize(raw: dict) -> dict:
    # a request that ends after one token has no time per token
    b1 = {name: {"tpot_ms": statistics.median(r[1] for r in rows if r[2] > 1) * 1e3,
                 "latency_s": statistics.median(r[0] for r in rows)} for name, rows in raw["batch1"].items()}  # fmt: skip
    load_ = {name: {"tok_s": statistics.median(r["tok_s"] for r in rows),
                    "latency_s": statistics.median(r["latency_s"] for r in rows),
                    "tok_s_runs": [round(r["tok_s"], 2) for r in rows]} for name, rows in raw["load"].items()}  # fmt: skip
    return {
        "batch1": b1, "load": load_,
        "http_over_grpc": {
            "batch1_tpot": b1["http"]["tpot_ms"] / b1["grpc"]["tpot_ms"],
            "batch1_tpot_extra_ms": b1["http"]["tpot_ms"] - b1["grpc"]["tpot_ms"],
            "batch1_latency": b1["http"]["latency_s"] / b1["grpc"]["latency_s"],
            "load_throughput": load_["http"]["tok_s"] / load_["grpc"]["tok_s"],
            "load_latency": load_["http"]["latency_s"] / load_["grpc"]["latency_s"],
        },
    }


def render(meta: dict, s: dict) -> str:
    r = s["http_over_grpc"]
    return "\n".join([
        f"# HTTP (OpenAI-compatible) vs gRPC: {meta['date']}", "", f"Command: `{meta['command']}`  ",
        f"Machine: {meta['machine']}  ", f"Pair: {meta['pair']}; greedy, speculation off; {meta['options']}", "",
        "| | gRPC | HTTP | HTTP / gRPC |", "|---|---|---|---|",
        f"| batch 1: time per token (ms, median) | {s['batch1']['grpc']['tpot_ms']:.2f} | "
        f"{s['batch1']['http']['tpot_ms']:.2f} | {r['batch1_tpot']:.3f} ({r['batch1_tpot_extra_ms']:+.2f} ms) |",
        f"| batch 1: latency (s, median) | {s['batch1']['grpc']['latency_s']:.3f} | {s['batch1']['http']['latency_s']:.3f} "
        f"| {r['batch1_latency']:.3f} |",
        f"| under load: tokens/s (median of passes) | {s['load']['grpc']['tok_s']:.1f} | {s['load']['http']['tok_s']:.1f} "
        f"| {r['load_throughput']:.3f} |",
        f"| under load: mean latency (s) | {s['load']['grpc']['latency_s']:.2f} | {s['load']['http']['latency_s']:.2f} "
        f"| {r['load_latency']:.3f} |",
        "", f"Passes under load (tok/s): gRPC {s['load']['grpc']['tok_s_runs']}, HTTP {s['load']['http']['tok_s_runs']}", "",
    ])  # fmt: skip


app = typer.Typer(add_completion=False)


@app.command()
def main(pair: str = typer.Option("demo"), prompts: int = typer.Option(6), repeats: int = typer.Option(3),
         max_tokens: int = typer.Option(64), concurrency: int = typer.Option(8),
         load_requests: int = typer.Option(16), name: str = typer.Option("")) -> None:  # fmt: skip
    config = LaunchConfig(pair=pair, port=0, metrics_port=None, http_port=0, draft=False)
    with launch(config) as stack:
        raw = asyncio.run(measure(stack.endpoints.scheduler, stack.endpoints.http_url, Models(pair=pair).target_dir(),
                                  prompts=prompts,
                                  repeats=repeats, max_tokens=max_tokens, concurrency=concurrency,
                                  load_requests=load_requests))  # fmt: skip
    s = summarize(raw)
    meta = {"command": "python -m bench.http_overhead " + " ".join(sys.argv[1:]), "pair": pair,
            "machine": ", ".join(f"{k} {v}" for k, v in machine(2).items() if k in ("platform", "cpu_count", "torch")),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "options": f"{prompts} prompts x {repeats} repeats, {max_tokens} tokens, load: {load_requests} requests at "
                       f"concurrency {concurrency}"}  # fmt: skip
    out = RESULTS / (name or f"http-{pair}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "http.json").write_text(json.dumps(meta | s | {"raw": raw}, indent=2) + "\n")
    (out / "README.md").write_text(render(meta, s))
    print((out / "README.md").read_text())


if __name__ == "__main__":
    app()
