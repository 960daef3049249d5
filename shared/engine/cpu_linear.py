"""Linear layers with oneDNN-prepacked weights for CPU forwards of a few rows.

On CPU a decode or verify forward multiplies a handful of token rows by every
weight matrix, so it is bound by reading the weights. MKL's sgemm (what
``F.linear`` calls) reads them fast for 1-3 rows but switches kernel at 4 and
costs a third more from there (SmolLM2-135M, 2 threads: 31 ms for its 210
projections at 1-3 rows, 42 ms at 4, 47 ms at 8). The same projections on
weights reordered once into oneDNN's blocked layout cost 35 / 35 / 41 ms: flat
up to 6 rows. This is what torch's own compiler does on CPU
(``torch._inductor`` weight prepacking with ``freezing``), without compiling.

    PackedLinear(x)   rows < min_rows ──▶ F.linear (MKL, the fast path for 1-3 rows)
                      rows ≥ min_rows ──▶ mkldnn._linear_pointwise on the packed weight

The original weight stays (tied embeddings share it, ``state_dict`` and
``save_pretrained`` see it); the packed copy is a plain attribute, so it doubles
the projections' memory on CPU. Nothing changes on other devices or dtypes, or
where this torch has no oneDNN: ``prepack`` leaves those models alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_MIN_ROWS = 4  # MKL sgemm is the faster of the two below this many rows


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Can this torch prepack a linear layer for ``device``/``dtype``?"""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Module):
    """An ``nn.Linear`` that multiplies by a oneDNN-prepacked copy of its weight from ``min_rows`` rows on."""

    def __init__(self, linear: nn.Linear, min_rows: int = DEFAULT_MIN_ROWS):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter: tied weights stay tied
        self.bias = linear.bias
        self.min_rows = min_rows
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())  # opaque blocked layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows < self.min_rows or x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).contiguous()  # [rows, in]
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, bias, "none", [], "")  # [rows, out]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, min_rows={self.min_rows}"


def prepack(model: nn.Module, min_rows: int = DEFAULT_MIN_ROWS) -> int:
    """Swap every ``nn.Linear`` of ``model`` for a PackedLinear where that pays (CPU, float32); returns how many.

    A layer whose packed product does not match ``F.linear`` on a probe is left as it was.
    """
    first = next(model.parameters(), None)
    if first is None or not available(first.device, first.dtype):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            try:
                packed = PackedLinear(child, min_rows)
                probe = torch.randn(max(min_rows, 1), child.in_features, dtype=child.weight.dtype)
                with torch.no_grad():
                    if not torch.allclose(packed(probe), F.linear(probe, child.weight, child.bias), rtol=1e-4, atol=1e-4):
                        continue
            except RuntimeError:  # this build's oneDNN cannot pack it: keep MKL
                continue
            setattr(parent, name, packed)
            swapped += 1
    return swapped
