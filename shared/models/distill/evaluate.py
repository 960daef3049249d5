"""How good a draft is for its target: greedy agreement, chain acceptance, and forward cost.

Agreement is measured teacher-forced on the target's own greedy continuation
of held-out prompts: at every output position, does the draft's argmax equal
the target's? For greedy chains this determines speculative decoding exactly.
A chain of k drafted after position i accepts the run of consecutive
agreements starting at i (capped at k), then the target adds its bonus token::

    agree:   1 1 0 1 1 1 1 0 ...
    k = 4:   [1 1 0]→ 2 accepted + bonus     [1 1 1 1]→ 4 accepted + bonus   ...

so acceptance rate = accepted / proposed and tokens per step =
(accepted + steps) / steps follow without running a single verify pass.

Cost is the wall time of one decode forward at batch 1 through the engine's
ModelRunner (paged KV, the path the services run), draft over target.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from shared.models.distill.generate import Sample


@torch.inference_mode()
def greedy_labels(model, samples: list[Sample], max_seq_len: int = 1024) -> list[list[int]]:
    """Per sample, the model's argmax at every output position, teacher-forced, one unpadded sequence at a time."""
    out = []
    for s in samples:
        ids = (s.prompt_ids + s.output_ids[:-1])[:max_seq_len]
        m = len(s.prompt_ids)
        logits = model(input_ids=torch.tensor([ids])).logits[0, m - 1 :]  # [n, V]
        out.append(logits.argmax(-1).tolist())
    return out


@dataclass
class ChainStats:
    k: int
    acceptance_rate: float  # accepted / proposed
    tokens_per_step: float  # (accepted + bonus) per verify step


def chain_stats(agreements: list[list[bool]], k: int) -> ChainStats:
    accepted = proposed = steps = 0
    for agree in agreements:
        pos, n = 0, len(agree)
        while pos < n:
            run = 0
            while run < k and pos + run < n and agree[pos + run]:
                run += 1
            proposed += min(k, n - pos)
            accepted += run
            steps += 1
            pos += run + 1
    return ChainStats(k, accepted / max(1, proposed), (accepted + steps) / max(1, steps))


def agreement(target_labels: list[list[int]], draft_labels: list[list[int]]) -> tuple[float, list[list[bool]]]:
    per = [[a == b for a, b in zip(t, d)] for t, d in zip(target_labels, draft_labels)]
    total = sum(map(len, per))
    return sum(map(sum, per)) / max(1, total), per


def decode_step_seconds(model, *, context: int = 256, steps: int = 32, repeats: int = 3) -> float:
    """Median wall time of one batch-1 decode forward at ``context`` tokens through ModelRunner."""
    from shared.engine.config import EngineConfig
    from shared.engine.runner import ModelRunner, Work

    runner = ModelRunner(model, EngineConfig(block_size=16, num_blocks=(context + steps + 32) // 16 + 2))
    times = []
    for r in range(repeats):
        seq = runner.add(f"probe{r}", [(7 * i) % 1000 + 3 for i in range(context)])
        runner.forward([Work(seq, want_root=True)])  # prefill
        for i in range(steps):
            runner.commit(seq, [11 + i])
            t = time.perf_counter()
            runner.forward([Work(seq, want_root=True)])
            times.append(time.perf_counter() - t)
        runner.release(seq.seq_id)
    return statistics.median(times)
