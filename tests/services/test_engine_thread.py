"""A model service loads its engine on the thread that runs it: one OpenMP team per process.

libgomp gives every thread that starts a parallel region a team of its own, and once a process
holds more OpenMP threads than CPUs it shortens the spin wait between regions to ~100 iterations.
A forward is thousands of small parallel regions, so a load on asyncio's default executor (a
second team) made every decode ~1.7x slower on 2 cores (services/engine_host.py, EngineHost.load).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.engine_host import EngineHost
from services.settings import ServiceSettings


@pytest.mark.parametrize("role", ["target", "draft"])
def test_the_engine_is_built_on_the_thread_that_runs_it(tmp_path, monkeypatch, role):
    from shared.engine import factory
    from shared.models.tiny import save_tiny

    model = save_tiny(tmp_path / role, "llama", num_layers=1, seed=1)
    built_on: list[threading.Thread] = []
    for name in ("build_target_engine", "build_draft_engine"):
        real = getattr(factory, name)

        def recording(*args, _real=real, **kwargs):
            built_on.append(threading.current_thread())
            return _real(*args, **kwargs)

        monkeypatch.setattr(f"services.engine_host.{name}", recording)

    async def threads() -> tuple[threading.Thread, threading.Thread]:
        host = await EngineHost.load(ServiceSettings(model=str(model), device="cpu"), role)
        try:
            ran_on = (await host.run(threading.current_thread)).result
            again = (await host.run(threading.current_thread)).result
            assert again is ran_on  # every call on the same thread
            return built_on[0], ran_on
        finally:
            host.close()

    built, ran = asyncio.run(threads())
    assert built is ran and built is not threading.main_thread()
    assert built.name.startswith(f"tandem-{role}-engine")


def test_a_failed_load_leaves_no_engine_thread(tmp_path):
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(Exception):
        asyncio.run(EngineHost.load(ServiceSettings(model=str(tmp_path / "missing"), device="cpu"), "target"))
    leftover = {t.name for t in threading.enumerate()} - before
    assert not [n for n in leftover if n.startswith("tandem-target-engine")]


def _host(engine, loaded) -> EngineHost:
    return EngineHost(engine, loaded, "draft", model_name="x")


def test_a_step_stream_calls_a_model_free_engine_on_the_event_loop():
    """No torch, so no OpenMP team to keep on one thread: a step skips the hop to the engine thread (two
    wake-ups, 0.1-0.3 ms on 2 cores); unary calls still take it. Both keep the order of arrival (one lock)."""
    from shared.engine.ngram_drafter import NgramDraftEngine

    async def threads():
        host = _host(NgramDraftEngine(), None)
        try:
            assert host.inline_steps
            step = (await host.run_step(threading.current_thread)).result
            unary = (await host.run(threading.current_thread)).result
            host.inline_steps = False  # e.g. a CPU engine on several torch threads
            hopped = (await host.run_step(threading.current_thread)).result
            return step, unary, hopped, threading.current_thread()
        finally:
            host.close()

    step, unary, hopped, loop_thread = asyncio.run(threads())
    assert step is loop_thread
    assert unary is not loop_thread and hopped is unary


def test_steps_run_inline_only_where_no_second_openmp_team_can_form(monkeypatch):
    from types import SimpleNamespace

    from services import engine_host

    def engine(device: str):
        return SimpleNamespace(runner=SimpleNamespace(device=SimpleNamespace(type=device)))

    loaded = object()
    assert engine_host.steps_inline(engine("cpu"), None)  # model-free
    assert engine_host.steps_inline(engine("cuda"), loaded)  # kernels launch; no CPU team
    monkeypatch.setattr(engine_host, "cpu_threads", lambda: 1)
    assert engine_host.steps_inline(engine("cpu"), loaded)
    monkeypatch.setattr(engine_host, "cpu_threads", lambda: 2)
    assert not engine_host.steps_inline(engine("cpu"), loaded)  # the engine thread keeps the one team
