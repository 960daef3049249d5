"""Merge a layer's projections into one weight, and let the transformers modules read theirs from it.

    qkv = merge([attn.q_proj, attn.k_proj, attn.v_proj])     # nn.Linear [Nq + 2 Nkv, hidden]

The merged weight is a new tensor (the rows of each projection, one after the
other). The original projections then read their weights (and biases) as views
into it, so the model's memory does not grow, and the transformers model stays
whole: its own forward, ``state_dict`` and a reference built from it see the
same values as before. Tied weights are never merged (embeddings and LM head
stay as they are).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def merge(projections: list[nn.Module]) -> nn.Linear:
    """One nn.Linear computing ``cat([p(x) for p in projections], -1)``; each projection's weight and bias
    become views into the merged ones. Projections are nn.Linear-like (``weight``, ``bias``; cpu_linear's too)."""
    weights = [p.weight for p in projections]  # [out_i, in] each
    biases = [p.bias for p in projections]
    if any(b is None for b in biases) and any(b is not None for b in biases):
        biases = [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]
    has_bias = biases[0] is not None
    first = weights[0]
    merged = nn.Linear(first.shape[1], sum(w.shape[0] for w in weights), bias=has_bias, device="meta")
    merged.weight = nn.Parameter(torch.cat([w.detach() for w in weights]), requires_grad=False)  # [sum out, in]
    if has_bias:
        merged.bias = nn.Parameter(torch.cat([b.detach() for b in biases]), requires_grad=False)  # [sum out]
    start = 0
    for p, w in zip(projections, weights):
        rows = w.shape[0]
        w.data = merged.weight.data[start : start + rows]  # same Parameter object, now a view: ties stay
        if has_bias and p.bias is not None:
            p.bias.data = merged.bias.data[start : start + rows]
        start += rows
    return merged


def shared_linear(linear: nn.Module) -> nn.Linear:
    """An nn.Linear over the very same weight and bias Parameters (no copy) as ``linear``."""
    out = nn.Linear(linear.weight.shape[1], linear.weight.shape[0], bias=linear.bias is not None, device="meta")
    out.weight = linear.weight
    out.bias = linear.bias
    return out
