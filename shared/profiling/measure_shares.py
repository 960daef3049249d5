"""Latency of draft and target at several shares of the machine (FASER §4.4), one subprocess per share.

    profiles = profile_shares({"draft": draft_dir, "target": target_dir}, device="cpu")   # {role: ShareProfile}

A share is a process-level setting: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is read
when the process creates its CUDA context, and torch's CPU thread pools are
sized at first use. So each share gets a fresh worker process (``python -m
shared.profiling.measure_shares SPEC.json``), which loads both models and
measures them one after the other, each alone on its share::

    CPU    x = n / N at n = 1..N torch threads (N: the cores to split, at most 8 counts, 1 and N included);
           OMP_NUM_THREADS = MKL_NUM_THREADS = n and OMP_WAIT_POLICY=PASSIVE, as the launcher runs the services
    CUDA   x = p / 100 at MPS active-thread percentages p; only a running MPS daemon enforces them
           (without one the curve comes out flat; a warning says so)

Per model and share, every (b, s) of the grid, interleaved within each repeat,
median of the repeats, on b sequences of ``context`` prompt tokens::

    draft    one DraftEngine.speculate: a chain of s tokens for each of b sequences
             (s forwards of b tokens, sampling included: what the draft service runs per call)
    target   one verify forward: root + s chained nodes for each of b sequences (measure.py's verify)

Nothing is committed (the drafted / verified tree is dropped), so the context
stays put. ``sm_share.fit_latency`` then fits eq. 11 / 12.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from shared.omp_wait import apply_defaults
from shared.profiling.sm_share import (
    Role,
    ShareProfile,
    ShareSample,
    available_cores,
    fit_latency,
    share_hardware,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BATCHES = (1, 2, 4, 8)
DEFAULT_TOKENS = (1, 2, 4)
DEFAULT_PERCENTAGES = (10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
MAX_THREAD_COUNTS = 8


class WorkerSpec(BaseModel):
    """What one worker measures, at the share its environment gives it."""

    models: dict[Role, str] = Field(description="Model directory (or .gguf) per role.")
    device: str = "cpu"
    dtype: str = "auto"
    threads: int | None = Field(None, description="torch.set_num_threads (CPU shares).")
    batches: list[int] = Field(default_factory=lambda: list(DEFAULT_BATCHES))
    tokens: list[int] = Field(default_factory=lambda: list(DEFAULT_TOKENS))
    context: int = 64
    repeats: int = 3
    out: str = Field(description="Where the worker writes its WorkerResult.")


class WorkerResult(BaseModel):
    names: dict[Role, str]  # the loaded models' names
    device: str
    dtype: str
    gpu: str | None = None  # torch.cuda.get_device_name, on CUDA
    samples: dict[Role, list[tuple[int, int, float]]]  # (b, s, median seconds)


def thread_counts(cores: int) -> list[int]:
    """1..cores, thinned to at most MAX_THREAD_COUNTS evenly spaced counts (1 and cores kept)."""
    if cores <= MAX_THREAD_COUNTS:
        return list(range(1, cores + 1))
    k = MAX_THREAD_COUNTS - 1
    return sorted({1 + round(i * (cores - 1) / k) for i in range(k + 1)})


def mps_daemon_running() -> bool:
    """Is there an MPS control pipe where CUDA clients look for one?"""
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")).joinpath("control").exists()


def profile_shares(
    models: dict[Role, Path | str],
    *,
    device: str = "cpu",
    dtype: str = "auto",
    cores: int | None = None,
    percentages: Sequence[int] = DEFAULT_PERCENTAGES,
    batches: Sequence[int] = DEFAULT_BATCHES,
    tokens: Sequence[int] = DEFAULT_TOKENS,
    context: int = 64,
    repeats: int = 3,
    log: Callable[[str], None] = lambda _: None,
) -> dict[Role, ShareProfile]:
    """Run one worker per share, fit eq. 11 (draft) / 12 (target); the profiles are not saved here.

    ``device`` "cpu" splits ``cores`` (default: the cores this process may use)
    into thread counts; "cuda[:N]" runs the ``percentages``.
    """
    start = time.perf_counter()
    on_cuda = device.startswith("cuda")
    if on_cuda:
        if not mps_daemon_running():
            log("warning: no MPS daemon found (nvidia-cuda-mps-control -d): the percentages are not enforced")
        points = [(p / 100, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(p)}, None) for p in sorted(percentages)]
        unit, total = "mps", 100
    else:
        total = cores or available_cores()
        points = [
            (n / total, {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n)}, n) for n in thread_counts(total)
        ]
        unit = "threads"
    samples: dict[Role, list[ShareSample]] = {role: [] for role in models}
    result = None
    with tempfile.TemporaryDirectory(prefix="tandem-shares-") as tmp:
        for share, env, threads in points:
            spec = WorkerSpec(
                models={role: str(path) for role, path in models.items()}, device=device, dtype=dtype,
                threads=threads, batches=list(batches), tokens=list(tokens), context=context, repeats=repeats,
                out=str(Path(tmp) / f"result-{share:.4f}.json"),
            )  # fmt: skip
            result = _run_worker(spec, env, Path(tmp))
            for role, rows in result.samples.items():
                samples[role] += [ShareSample(share=share, b=b, s=s, duration_s=t) for b, s, t in rows]
            log(f"share {share:.2f} ({unit}) done ({time.perf_counter() - start:.1f} s)")
    hardware = share_hardware(cores=total, gpu=result.gpu if on_cuda else None)
    settings = {
        "shares": [p[0] for p in points], "batches": list(batches), "tokens": list(tokens), "context": context,
        "repeats": repeats, "seconds": round(time.perf_counter() - start, 1),
    }  # fmt: skip
    out: dict[Role, ShareProfile] = {}
    for role in models:
        fitted, r2 = fit_latency(samples[role], role)
        out[role] = ShareProfile(
            model=result.names[role], role=role, hardware=hardware, device=result.device, dtype=result.dtype,
            unit=unit, total=total, r2=r2, samples=samples[role], settings=settings, **{role: fitted},
        )  # fmt: skip
    return out


def _run_worker(spec: WorkerSpec, share_env: dict[str, str], tmp: Path) -> WorkerResult:
    spec_path = tmp / "spec.json"
    spec_path.write_text(spec.model_dump_json())
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    apply_defaults(env)  # as the launcher runs the services
    env.update(share_env)
    proc = subprocess.run(
        [sys.executable, "-m", "shared.profiling.measure_shares", str(spec_path)],
        env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"share worker ({share_env}) exited with code {proc.returncode}:\n{tail}")
    return WorkerResult.model_validate_json(Path(spec.out).read_text())


# ----------------------------------------------------------------------------- the worker (torch)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def _measure(call: Callable[[int, int], None], device, spec: WorkerSpec) -> list[tuple[int, int, float]]:
    """Median seconds of call(b, s) per (b, s), sizes interleaved within each repeat, after a warm-up."""
    grid = list(itertools.product(spec.batches, spec.tokens))
    for b, s in (grid[0], grid[-1]):  # warm-up: allocator, kernels, thread pools
        call(b, s)
    times: dict[tuple[int, int], list[float]] = {key: [] for key in grid}
    for _ in range(spec.repeats):
        for b, s in grid:
            _sync(device)
            t0 = time.perf_counter()
            call(b, s)
            _sync(device)
            times[(b, s)].append(time.perf_counter() - t0)
    return [(b, s, _median(times[(b, s)])) for b, s in grid]


def _draft_samples(path: str, spec: WorkerSpec) -> tuple[str, object, list]:
    from shared.engine.factory import build_draft_engine
    from shared.engine.types import PrefillItem, SpecItem

    engine, loaded = build_draft_engine(path, device=spec.device, dtype=spec.dtype, with_tokenizer=False)
    runner = engine.runner
    ids = [f"shares-{os.getpid()}-{i}" for i in range(max(spec.batches))]
    prompts = [[(11 + 7 * i + j) % runner.vocab_size for j in range(spec.context)] for i in range(len(ids))]
    engine.prefill([PrefillItem(seq_id=sid, prompt_ids=p) for sid, p in zip(ids, prompts)])
    try:
        # nothing new committed, no rollback: each call drops the last call's chain and drafts again
        rows = _measure(lambda b, s: engine.speculate([SpecItem(sid, chain_len=s) for sid in ids[:b]]), runner.device,
                        spec)  # fmt: skip
    finally:
        engine.release(ids)
    return loaded.name, runner, rows


def _target_samples(path: str, spec: WorkerSpec) -> tuple[str, object, list]:
    from shared.engine.factory import build_target_engine
    from shared.engine.runner import Work

    engine, loaded = build_target_engine(path, device=spec.device, dtype=spec.dtype, with_tokenizer=False)
    runner = engine.runner
    vocab = runner.vocab_size
    ids = [f"shares-{os.getpid()}-{i}" for i in range(max(spec.batches))]
    seqs = [runner.add(sid, [(11 + 7 * i + j) % vocab for j in range(spec.context)]) for i, sid in enumerate(ids)]

    def verify(b: int, s: int) -> None:
        works = [Work(seq, new_nodes=[((7 + j) % vocab, j - 1) for j in range(s)], want_root=True, want_nodes=True)
                 for seq in seqs[:b]]  # fmt: skip
        runner.forward(works)
        for seq in seqs[:b]:
            runner.commit(seq, [])  # drop the tree: nothing is committed

    try:
        runner.forward([Work(seq) for seq in seqs])  # prefill
        rows = _measure(verify, runner.device, spec)
    finally:
        for sid in ids:
            runner.release(sid)
    return loaded.name, runner, rows


def worker(spec: WorkerSpec) -> WorkerResult:
    import torch

    if spec.threads:
        torch.set_num_threads(spec.threads)
    names, samples, device, dtype = {}, {}, "cpu", "float32"
    for role, path in spec.models.items():
        name, runner, rows = (_draft_samples if role == "draft" else _target_samples)(path, spec)
        names[role], samples[role] = name, rows
        device, dtype = str(runner.device), str(runner.dtype).removeprefix("torch.")
        del runner  # one model in memory at a time
    gpu = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
    return WorkerResult(names=names, device=device, dtype=dtype, gpu=gpu, samples=samples)


if __name__ == "__main__":
    spec = WorkerSpec.model_validate_json(Path(sys.argv[1]).read_text())
    Path(spec.out).write_text(worker(spec).model_dump_json())
