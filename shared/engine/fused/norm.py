"""RMSNorm as one ``F.rms_norm`` call, over the transformers module's own weight.

The transformers RMSNorms normalise in float32, round to the model's dtype, then
multiply by the weight in that dtype. ``F.rms_norm`` with the weight does the
same in float32 (bit for bit); in 16 bits it multiplies before rounding, one
rounding fewer, so there the weight multiplies the normalised rows separately:
two ops, and again the transformers module's bits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``weight * x / rms(x)`` over the last dim (float32 inside, as the transformers RMSNorms compute it)."""

    def __init__(self, weight: nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight  # the transformers norm's Parameter: shared, not copied
        self.eps = eps
        self.shape = (weight.shape[0],)
        self.weight_inside = weight.dtype == torch.float32  # F.rms_norm's weight rounds as transformers' only here

    @classmethod
    def like(cls, norm: nn.Module) -> "RMSNorm":
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps")
        return cls(norm.weight, float(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_inside:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return F.rms_norm(x, self.shape, None, self.eps) * self.weight
