"""Move a model's weights between devices in place, one storage at a time (the draft's offload and reload).

Each storage moves once and every tensor on it comes back as the same view of
the moved copy, so module references stay valid, tied weights stay tied, and
the transformers projections that read their weights as views of the fused
decoder's merged ones (fused/repack.py) keep sharing them instead of each
taking a copy of its own along.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn


def move_weights(modules: Iterable[nn.Module], device: torch.device, *, pin: bool) -> int:
    """Parameters and buffers of ``modules`` to ``device`` (pinned when ``pin`` and the CPU); bytes moved."""
    tensors: list[torch.Tensor] = []
    seen: set[int] = set()
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in seen and tensor.device != device:
                seen.add(id(tensor))
                tensors.append(tensor)

    def transfer(raw: torch.Tensor) -> torch.Tensor:
        copy = raw.to(device, non_blocking=device.type == "cuda")
        return copy.pin_memory() if pin and device.type == "cpu" else copy

    return relocate(tensors, transfer)


def relocate(tensors: list[torch.Tensor], transfer: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """Give each tensor's storage to ``transfer`` once (as its raw bytes, [nbytes] uint8) and re-point every
    tensor (``.data``) at its place in the copy; returns the bytes transferred."""
    copies: dict[int, torch.Tensor] = {}  # storage address -> its bytes after the transfer
    moved = 0
    for tensor in tensors:
        storage = tensor.untyped_storage()
        copy = copies.get(storage.data_ptr())
        if copy is None:
            raw = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)  # [nbytes]
            copy = copies[storage.data_ptr()] = transfer(raw)
            moved += storage.nbytes()
        view = torch.empty(0, dtype=tensor.dtype, device=copy.device)
        tensor.data = view.set_(copy.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())
    return moved
