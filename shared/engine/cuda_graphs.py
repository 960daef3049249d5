"""CUDA graphs of the static step's body, one per bucket, replayed with one staged copy per step.

    step ──bucket_for──▶ bucket ──▶ captured? ──no──▶ capture (warm up on a side stream, then record
                                        │              StaticStep.body into the shared memory pool)
                                        ▼
                         build the step padded to the bucket into the graph's pinned staging buffer,
                         one non-blocking copy into its static input, replay, return its static outcome

A pool serves any step kind that offers ``bucket(shape)`` (the bucket that holds
a step, or None), ``build(steps, shape, scratch_block)`` (its staging array) and
``body(static_in, shape)`` (the device work): the target's verify step
(``static_step.StaticStep``) and the draft's greedy chain (``draft_chain_step``).
Graphs are captured at service start for the common shapes (``warm``: the target's
decode and 4-token verify at every batch bucket and the first context bucket, largest
first) and on first use of any other bucket (capture time and pool memory are
logged), and kept up to ``MAX_GRAPHS``, least recently used dropped first. They
read the KV pool's tensor, so a pool that is reallocated or resized (Nightjar's
offload) drops them all. One KV block is kept aside as the padding's scratch space
(``step_plan.build``); the runner's accounting knows it (``ModelRunner.reserved``).
``release()`` gives it back and drops the graphs (before a draft offloads its KV
pool, which must be empty); the next replay takes a block again.
A step that fits no bucket runs the same body eagerly.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

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
    static_out: torch.Tensor  # the body's outcome on the device ([B, 2 + M] int64 for a verify step)


class GraphPool:
    def __init__(self, runner, capture: bool = True):
        """``capture=False`` (tests on CPU): every step runs its bucket's padded body eagerly, the graph path's
        bucketing, padding and scratch block without a CUDA graph."""
        self.runner = runner
        self.capture = capture
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: OrderedDict[tuple[str, object], _Graph] = OrderedDict()  # (step kind, bucket) -> graph
        self.scratch_block: int | None = None
        self._allocator = None  # the allocator the scratch block came from (a reallocated pool has a new one)
        self._kv_ptr = runner.cache.kv.data_ptr()
        self.replays = 0
        self.eager = 0
        self.reserve()

    def reserve(self) -> int:
        """The padding's KV block, taken from the runner's pool at start and again after a release or a
        reallocation (a reloaded draft's fresh pool)."""
        cache = self.runner.cache
        if self.scratch_block is None or self._allocator is not cache.allocator:
            self.runner.reserved.discard(self.scratch_block)
            self.scratch_block = cache.allocator.allocate(1, SCRATCH_OWNER)[0]
            self._allocator = cache.allocator
            self.runner.reserved.add(self.scratch_block)
        return self.scratch_block

    def release(self) -> None:
        """Give the scratch block back and drop every graph (the KV pool is about to be freed)."""
        self.graphs.clear()
        if self.scratch_block is not None and self._allocator is self.runner.cache.allocator:
            self.runner.cache.allocator.free([self.scratch_block])
        self.runner.reserved.discard(self.scratch_block)
        self.scratch_block = self._allocator = None

    def warm(self, step, buckets: list) -> None:
        """Capture ``buckets`` of ``step`` now, largest first, so no step stalls on a capture later (at service
        start: the common decode and verify shapes at the first context bucket). Logs the total."""
        if not self.capture:
            return
        scratch = self.reserve()
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(self.runner.device)
        todo = [b for b in sorted(set(buckets), key=lambda b: b.size, reverse=True) if (type(step).__name__, b) not in self.graphs]
        for bucket in todo:
            self._capture(step, (type(step).__name__, bucket), scratch)
        log.info("captured %d CUDA graphs of %s at start in %.1f s (+%.1f MiB reserved)", len(todo), type(step).__name__,
                 time.perf_counter() - start, (torch.cuda.memory_reserved(self.runner.device) - before) / 2**20)  # fmt: skip

    def forget(self, kind: str) -> None:
        """Drop the graphs of one step kind (its persistent buffers moved)."""
        for key in [key for key in self.graphs if key[0] == kind]:
            del self.graphs[key]

    def run(self, step, steps: list, shape) -> torch.Tensor:
        """Replay the graph of ``shape``'s bucket for ``step`` (captured on first use); eager where none fits."""
        runner = self.runner
        scratch = self.reserve()
        if runner.cache.kv.data_ptr() != self._kv_ptr:  # the pool was reallocated: graphs read the old one
            self.graphs.clear()
            self._kv_ptr = runner.cache.kv.data_ptr()
        bucket = step.bucket(shape)
        if bucket is None:
            self.eager += 1
            flat = step.stage(step.build(steps, shape, scratch))
            with graph_body():
                return step.body(flat, shape)
        if not self.capture:  # the padded bucket, run eagerly
            self.replays += 1
            flat = step.stage(step.build(steps, bucket, scratch))
            with graph_body():
                return step.body(flat, bucket)[: len(steps)]
        key = (type(step).__name__, bucket)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._capture(step, key, scratch)
        self.graphs.move_to_end(key)
        entry.host.numpy()[:] = step.build(steps, bucket, scratch)
        entry.static_in.copy_(entry.host, non_blocking=True)
        entry.graph.replay()
        self.replays += 1
        return entry.static_out[: len(steps)]

    def _capture(self, step, key: tuple[str, object], scratch: int) -> _Graph:
        device = self.runner.device
        bucket = key[1]
        start = time.perf_counter()
        before = torch.cuda.memory_reserved(device)
        host = torch.empty(bucket.size, dtype=torch.long, pin_memory=True)
        host.numpy()[:] = step.build([], bucket, scratch)
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
        self.graphs[key] = entry
        log.info(
            "captured a CUDA graph of %s for B=%d Q=%d kv=%d%s in %.0f ms (+%.1f MiB reserved; %d graphs)",
            key[0], bucket.batch, bucket.q, bucket.kv_cap, " chains" if bucket.chains else "",
            1e3 * (time.perf_counter() - start), (torch.cuda.memory_reserved(device) - before) / 2**20, len(self.graphs),
        )  # fmt: skip
        return entry
