"""RMSNorm as one ``F.rms_norm`` call, over the transformers module's own weight."""

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

    @classmethod
    def like(cls, norm: nn.Module) -> "RMSNorm":
        eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps")
        return cls(norm.weight, float(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.shape, self.weight, self.eps)
