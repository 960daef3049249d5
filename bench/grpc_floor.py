"""The floor under a step stream: one bidirectional gRPC ping-pong between two processes on loopback.

    python -m bench.grpc_floor [--servers aio,aiohop,sync] [--messages 2000] [--bytes 300]

The server echoes each message of one long-lived call; the client writes one and reads its echo, as the
scheduler's PlanStream does with a step plan. Servers: ``aio`` (grpc.aio, a handler coroutine), ``aiohop``
(grpc.aio, each message through a one-thread executor and back, as EngineHost hands every step to the
engine thread), ``sync`` (the thread-pool server). Clients: grpc.aio and sync. No Tandem code runs, so the
medians are what the transport alone costs per step on this machine: what a step stream's orchestration
cannot go below with this stack (docs/services.md, "Step streams").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio

SERVERS = ("aio", "aiohop", "sync")
CLIENTS = ("aio", "sync")


def _same(b: bytes) -> bytes:
    return b


def _handler(kind: str):
    if kind == "sync":
        def echo(it, ctx):
            yield from it
    else:
        pool = ThreadPoolExecutor(1)

        async def echo(it, ctx):
            loop = asyncio.get_running_loop()
            async for m in it:
                yield (await loop.run_in_executor(pool, _same, m)) if kind == "aiohop" else m
    method = grpc.stream_stream_rpc_method_handler(echo, _same, _same)
    return grpc.method_handlers_generic_handler("floor.Echo", {"Stream": method})


def serve(kind: str, port: int) -> None:
    if kind == "sync":
        server = grpc.server(ThreadPoolExecutor(4))
        server.add_generic_rpc_handlers((_handler(kind),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        server.wait_for_termination()
        return

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_handler(kind),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


async def _aio_client(port: int, n: int, size: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await asyncio.wait_for(channel.channel_ready(), 30)
        call = channel.stream_stream("/floor.Echo/Stream", request_serializer=_same,
                                     response_deserializer=_same)(wait_for_ready=True)  # fmt: skip
        msg, times = b"x" * size, []
        for _ in range(n):
            t = time.perf_counter()
            await call.write(msg)
            await call.read()
            times.append(time.perf_counter() - t)
        await call.done_writing()
        return times


def _sync_client(port: int, n: int, size: int) -> list[float]:
    import queue

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def plans():
        while (m := outbox.get()) is not None:
            yield m

    replies = channel.stream_stream("/floor.Echo/Stream", request_serializer=_same, response_deserializer=_same)(plans(), wait_for_ready=True)
    msg, times = b"x" * size, []
    for _ in range(n):
        t = time.perf_counter()
        outbox.put(msg)
        next(replies)
        times.append(time.perf_counter() - t)
    outbox.put(None)
    channel.close()
    return times


def measure(servers: list[str], messages: int, size: int) -> list[dict]:
    from shared.free_ports import free_ports

    rows = []
    for kind in servers:
        for client in CLIENTS:
            (port,) = free_ports("127.0.0.1", 1)
            proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "--serve", kind, "--port", str(port)])
            try:
                if client == "aio":
                    times = asyncio.run(_aio_client(port, messages, size))
                else:
                    times = _sync_client(port, messages, size)
            finally:
                proc.terminate()
                proc.wait()
            times = times[len(times) // 10 :]  # the first tenth warms the call up
            rows.append({"server": kind, "client": client, "median_ms": statistics.median(times) * 1e3,
                         "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3, "messages": len(times)})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--bytes", type=int, default=300, help="message size (a batch-1 chain plan is ~300 bytes)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port)
        return 0
    servers = [s for s in args.servers.split(",") if s]
    if unknown := set(servers) - set(SERVERS):
        parser.error(f"unknown servers {sorted(unknown)}; choose from {', '.join(SERVERS)}")
    rows = measure(servers, args.messages, args.bytes)
    if args.json:
        print(json.dumps({"rows": rows}))
    else:
        print("| server | client | round trip median (ms) | p90 (ms) |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['server']} | {r['client']} | {r['median_ms']:.3f} | {r['p90_ms']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
