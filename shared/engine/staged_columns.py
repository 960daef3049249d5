"""The batch's sampling parameters as five staged ``int64`` columns, read back on the device as ``batched_probs``'s.

    greedy [B], top_k [B] as integers; temp, top_p, min_p [B] as float64 bit patterns (exact float32 values)

Padded sequences (a graph bucket's) are greedy. Which filters any request wants is part of a step's shape
(``filters``): the body runs only those, so a CUDA graph captured for one set serves every batch with it.
"""

from __future__ import annotations

import numpy as np
import torch

NUM = 5  # greedy, top_k, temp, top_p, min_p


def filters(params: list, vocab: int) -> tuple[bool, bool, bool]:
    """Whether any request uses top-k, top-p, min-p."""
    return (any(0 < p.top_k < vocab for p in params), any(p.top_p < 1.0 for p in params),
            any(p.min_p > 0.0 for p in params))  # fmt: skip


def fill(block: np.ndarray, params: list, vocab: int) -> None:
    """Write ``params`` (one per real sequence) into ``block`` [5 * B] int64; the rest are greedy."""
    cols = block.reshape(NUM, -1)
    floats = cols[2:].view(np.float64)  # [3, B] temp, top_p, min_p
    cols[0], cols[1] = 1, vocab
    floats[0], floats[1], floats[2] = 1.0, 1.0, 0.0
    for b, p in enumerate(params):
        cols[0, b], cols[1, b] = int(p.greedy), p.top_k if 0 < p.top_k < vocab else vocab
        floats[0, b] = 1.0 if p.greedy else np.float32(p.temperature)
        floats[1, b], floats[2, b] = np.float32(p.top_p), np.float32(p.min_p)


def read(block: torch.Tensor, want: tuple[bool, bool, bool]) -> dict:
    """The staged block [5 * B] on the device -> ``batched_probs``'s columns."""
    cols = block.view(NUM, -1)
    floats = cols[2:].view(torch.float64).float()  # [3, B]
    return {"greedy": cols[0] > 0, "top_k": cols[1], "temp": floats[0], "top_p": floats[1], "min_p": floats[2],
            "any": want}  # fmt: skip
