"""CUDA graphs of the static step's body, one per bucket, replayed with one staged copy per step.

    step ──bucket_for──▶ bucket ──▶ captured? ──no──▶ capture (warm up on a side stream, then record
                                        │              StaticStep.body into the shared memory pool)
                                        ▼
                         build the step padded to the bucket into the graph's pinned staging buffer,
                         one non-blocking copy into its static input, replay, return its static outcome

Graphs are captured on first use of a bucket (capture time and pool memory are
logged) and kept up to ``MAX_GRAPHS``, least recently used dropped first. They
read the KV pool's tensor, so a pool that is reallocated or resized (Nightjar's
offload) drops them all. One KV block is kept aside as the padding's scratch space
(``step_plan.build``); the runner's accounting knows it (``ModelRunner.reserved``).
A step that fits no bucket runs the same body eagerly.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from shared.engine import graph_buckets, step_plan
from shared.engine.step_plan import StepShape
from shared.profiling.host_work import graph_body

log = logging.getLogger(__name__)
MAX_GRAPHS = 64
SCRATCH_OWNER = "\x00graph-scratch"


def pool_for(runner) -> "GraphPool | None":
    """A graph pool for a CUDA runner (None on CPU, where the body runs eagerly)."""
    if runner.device.type != "cuda":
        return None
    return GraphPool(runner)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    host: torch.Tensor  # [size] int64 pinned staging
    static_in: torch.Tensor  # [size] int64 on the device
    static_out: torch.Tensor  # [B, 2 + M] int64 on the device


class GraphPool:
    def __init__(self, runner):
        self.runner = runner
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: OrderedDict[StepShape, _Graph] = OrderedDict()
        self.scratch_block = runner.cache.allocator.allocate(1, SCRATCH_OWNER)[0]
        runner.reserved.add(self.scratch_block)
        self._kv_ptr = runner.cache.kv.data_ptr()
        self.replays = 0
        self.eager = 0

    def run(self, step, steps: list[step_plan.SeqStep], shape: StepShape) -> torch.Tensor:
        runner = self.runner
        bs = runner.cache.block_size
        if runner.cache.kv.data_ptr() != self._kv_ptr:  # the pool was reallocated: graphs read the old one
            self.graphs.clear()
            self._kv_ptr = runner.cache.kv.data_ptr()
        bucket = graph_buckets.bucket_for(shape, bs, runner.max_context)
        if bucket is None:
            self.eager += 1
            flat = step.stage(step_plan.build(steps, shape, bs, self.scratch_block))
            with graph_body():
                return step.body(flat, shape)
        entry = self.graphs.get(bucket)
        if entry is None:
            entry = self._capture(step, bucket)
        self.graphs.move_to_end(bucket)
        entry.host.numpy()[:] = step_plan.build(steps, bucket, bs, self.scratch_block)
        entry.static_in.copy_(entry.host, non_blocking=True)
        entry.graph.replay()
        self.replays += 1
        return entry.static_out[: len(steps)]

    def _capture(self, step, bucket: StepShape) -> _Graph:
        device = self.runner.device
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(device)
        host = torch.empty(bucket.size, dtype=torch.long, pin_memory=True)
        host.numpy()[:] = step_plan.build([], bucket, self.runner.cache.block_size, self.scratch_block)
        static_in = host.to(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up: lazy inits and allocator state stay out of the graph
                step.body(static_in, bucket)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = step.body(static_in, bucket)
        torch.cuda.synchronize(device)
        if len(self.graphs) >= MAX_GRAPHS:
            self.graphs.popitem(last=False)
        entry = _Graph(graph, host, static_in, static_out)
        self.graphs[bucket] = entry
        log.info(
            "captured a CUDA graph for B=%d Q=%d kv=%d%s in %.0f ms (+%.1f MiB reserved; %d graphs)",
            bucket.batch, bucket.q, bucket.kv_cap, " chains" if bucket.chains else "",
            1e3 * (time.perf_counter() - start), (torch.cuda.memory_reserved(device) - before) / 2**20, len(self.graphs),
        )  # fmt: skip
        return entry
