"""An interleaved run starts its stacks at once (threads); every stack that came up is stopped on the way
out, also when another failed to start. The stacks here are stand-ins: the real ones are started by
test_bench_adaptive and test_harness_e2e."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack, contextmanager

import pytest

import bench.harness as harness_module
from bench.configs import StackKey
from bench.harness import BenchOptions, Harness


def _harness(tmp_path) -> Harness:
    return Harness(BenchOptions(name="start"), tmp_path)


def test_stacks_start_at_once_and_stop_on_the_way_out(tmp_path, monkeypatch):
    running, stopped, lock = [], [], threading.Lock()
    barrier = threading.Barrier(3, timeout=10)  # all three must be starting together, or this times out

    @contextmanager
    def fake_stack(models, key, log_dir, traces=True):
        barrier.wait()
        with lock:
            running.append(key.speculation_policy)
        try:
            yield f"stack-{key.speculation_policy}"
        finally:
            stopped.append(key.speculation_policy)

    monkeypatch.setattr(harness_module, "bench_stack", fake_stack)
    keys = [StackKey(speculation_policy=f"fixed:{k}") for k in (1, 2, 3)]
    with ExitStack() as on_exit:
        stacks = _harness(tmp_path)._start_all(keys, on_exit)
        assert stacks == ["stack-fixed:1", "stack-fixed:2", "stack-fixed:3"]  # in the keys' order
        assert sorted(running) == ["fixed:1", "fixed:2", "fixed:3"] and stopped == []
    assert sorted(stopped) == ["fixed:1", "fixed:2", "fixed:3"]


def test_a_stack_that_fails_to_start_stops_the_others(tmp_path, monkeypatch):
    stopped = []

    @contextmanager
    def fake_stack(models, key, log_dir, traces=True):
        if key.speculation_policy == "fixed:2":
            time.sleep(0.05)
            raise RuntimeError("target did not become SERVING")
        time.sleep(0.2 if key.speculation_policy == "fixed:3" else 0.0)  # still starting when the failure lands
        try:
            yield key.speculation_policy
        finally:
            stopped.append(key.speculation_policy)

    monkeypatch.setattr(harness_module, "bench_stack", fake_stack)
    keys = [StackKey(speculation_policy=f"fixed:{k}") for k in (1, 2, 3)]
    with pytest.raises(RuntimeError, match="SERVING"):
        with ExitStack() as on_exit:
            _harness(tmp_path)._start_all(keys, on_exit)
    assert sorted(stopped) == ["fixed:1", "fixed:3"]
