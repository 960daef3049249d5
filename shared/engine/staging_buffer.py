"""One step's staged indices: an ``int64`` host array (pinned on CUDA) and its device copy, grown by doubling.

Static steps (static_step.py, the static drafts) build every index a step needs with numpy into one flat
array; ``stage`` moves it to the device in one non-blocking copy. The host buffer is rewritten only after
the previous step's outcome was read, so the earlier copy has finished by then.
"""

from __future__ import annotations

import numpy as np
import torch


class StagingBuffer:
    def __init__(self, device: torch.device):
        self.device = device
        self._host: torch.Tensor | None = None  # [capacity] int64 (pinned on CUDA)
        self._dev: torch.Tensor | None = None  # [capacity] int64 on the device

    def stage(self, flat: np.ndarray) -> torch.Tensor:
        """Copy ``flat`` [size] to the device in one non-blocking copy; returns the device view [size]."""
        size = flat.size
        if self._dev is None or self._dev.numel() < size:
            capacity = max(size, 2 * (0 if self._dev is None else self._dev.numel()))
            self._dev = torch.empty(capacity, dtype=torch.long, device=self.device)
            self._host = torch.empty(capacity, dtype=torch.long, pin_memory=self.device.type == "cuda")
        host = self._host[:size]
        host.numpy()[:] = flat  # the previous step's copy has finished: its outcome was read
        dev = self._dev[:size]
        dev.copy_(host, non_blocking=True)
        return dev
