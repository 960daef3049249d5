"""Measure a model's verify forwards on its engine and fit what the policies need (``cost_model.py``).

    profile = measure(runner, model="smollm2-135m-instruct")    # ~1 min for SmolLM2-135M on 2 CPU cores

Every measured forward is a real verify: ``num_seqs`` sequences each re-run
their last token (the root) and a chain of speculative nodes, exactly what
``TargetEngine.verify`` sends, and the runner's own ``ForwardCost`` is the
sample. The tree is then discarded (``commit(seq, [])``), so the sequences
are reused and nothing is committed::

    budget sweep    context = short_context per sequence,
                    N = grid[i] batched tokens split over min(N, num_seqs) sequences
    context sweep   the same sequences grown to long_context, N in context_grid
    repeats         sizes interleaved within every repeat, medians per size

The budget comes from the budget sweep only (its context is fixed); the cost
model is fitted on both sweeps (context varies only in the second).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import torch

from shared.engine.runner import ModelRunner, Work
from shared.profiling.cost_model import Profile, Sample, find_budget, fit_cost_model, median_sweep
from shared.profiling.sm_share import cpu_model

DEFAULT_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64)
DEFAULT_CONTEXT_GRID = (4, 16, 32)


def hardware_name(device: torch.device | str) -> str:
    """What the numbers were measured on: the GPU's name, or the CPU model and the threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {cpu_model()} ({torch.get_num_threads()} threads)"


def _split(total: int, parts: int) -> list[int]:
    """``total`` tokens over ``parts`` sequences, as even as possible."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _verify_forward(runner: ModelRunner, seqs: list, num_tokens: int) -> Sample:
    """One verify forward of ``num_tokens`` batched tokens (root + chain per sequence), then discard it."""
    used = seqs[: min(num_tokens, len(seqs))]
    works = [
        Work(seq, new_nodes=[(7 + j, j - 1) for j in range(k - 1)], want_root=True, want_nodes=k > 1)
        for seq, k in zip(used, _split(num_tokens, len(used)))
    ]
    cost = runner.forward(works).cost
    for seq in used:
        runner.commit(seq, [])  # drop the tree: nothing is committed
    return Sample(**cost.__dict__)


def measure(
    runner: ModelRunner,
    *,
    model: str,
    grid: Sequence[int] = DEFAULT_GRID,
    context_grid: Sequence[int] = DEFAULT_CONTEXT_GRID,
    num_seqs: int = 4,
    short_context: int = 64,
    long_context: int = 512,
    repeats: int = 3,
    log: Callable[[str], None] = lambda _: None,
) -> Profile:
    """Run both sweeps on ``runner`` (its KV pool must hold num_seqs x long_context + max(grid) tokens)."""
    start = time.perf_counter()
    vocab = runner.vocab_size
    ids = [f"profile-{os.getpid()}-{i}" for i in range(num_seqs)]
    seqs = [runner.add(sid, [(11 + 7 * i + j) % vocab for j in range(short_context)]) for i, sid in enumerate(ids)]
    try:
        runner.forward([Work(s) for s in seqs])  # prefill: the prompts are cached from here on
        _verify_forward(runner, seqs, num_seqs)  # warm-up (allocator, kernels)

        budget_samples: list[Sample] = []
        mode_samples: list[Sample] = []  # the same sequences as a plain decode and as a verify of one drafted token each
        for r in range(repeats):
            for n in grid:
                budget_samples.append(_verify_forward(runner, seqs, n))
            for n in range(1, num_seqs + 1):
                mode_samples.append(_verify_forward(runner, seqs[:n], n))
                mode_samples.append(_verify_forward(runner, seqs[:n], 2 * n))
            log(f"budget sweep {r + 1}/{repeats} done ({time.perf_counter() - start:.1f} s)")

        context_samples: list[Sample] = []
        if long_context > short_context and context_grid:
            grow = long_context - short_context
            for i, seq in enumerate(seqs):
                runner.commit(seq, [(13 + 5 * i + j) % vocab for j in range(grow)])
            runner.forward([Work(s) for s in seqs])  # a prefill, not a verify: not a sample
            for r in range(repeats):
                for n in context_grid:
                    context_samples.append(_verify_forward(runner, seqs, n))
            log(f"context sweep done ({time.perf_counter() - start:.1f} s)")
    finally:
        for sid in ids:
            runner.release(sid)

    sweep = median_sweep(budget_samples)
    knee = find_budget(sweep)
    return Profile(
        model=model,
        hardware=hardware_name(runner.device),
        device=str(runner.device),
        dtype=str(runner.dtype).removeprefix("torch."),
        token_budget=knee.budget,
        knee=knee,
        cost_model=fit_cost_model(budget_samples + mode_samples + context_samples),
        sweep=sweep,
        samples=budget_samples + mode_samples + context_samples,
        settings={
            "grid": list(grid),
            "context_grid": list(context_grid),
            "num_seqs": num_seqs,
            "short_context": short_context,
            "long_context": long_context,
            "repeats": repeats,
            "threads": torch.get_num_threads(),
            "seconds": round(time.perf_counter() - start, 1),
        },
    )
