"""Linear layers with oneDNN-prepacked weights for CPU forwards of a few rows.

On CPU a decode or verify forward multiplies a handful of token rows by every
weight matrix, so it is bound by reading the weights. MKL's sgemm (what
``F.linear`` calls) reads them at very different speeds depending on the row
count and the CPU: on one of this project's machines SmolLM2-135M's 211
projections took 31 ms at 1-3 rows, 42 ms at 4 and 47 ms at 8 (2 threads); on
another (AMD EPYC, 2 threads) 31 ms at 1 row, 66 ms at 2, 81 ms at 3 and 64 ms at
4. The same projections on weights reordered once into oneDNN's blocked layout
are flat in the row count (35 / 35 / 41 ms on the first, 21.5 / 21.9 / 22.4 /
21.7 ms on the second). This is what torch's own compiler does on CPU
(``torch._inductor`` weight prepacking with ``freezing``), without compiling.

    PackedLinear(x)   rows < min_rows ──▶ F.linear (MKL)
                      rows ≥ min_rows ──▶ mkldnn._linear_pointwise on the packed weight

Where MKL stops being the faster path differs from CPU to CPU, so ``prepack``
measures it when it packs a model (``calibrate_min_rows``: the model's own
projections at 1 … 4 rows through both paths, a few hundred MB of weights so the
products read memory as a forward does, medians of 3; about a second for the
demo target) unless told a ``min_rows``.

The original weight stays (tied embeddings share it, ``state_dict`` and
``save_pretrained`` see it); the packed copy is a plain attribute, so it doubles
the projections' memory on CPU. Nothing changes on other devices or dtypes, or
where this torch has no oneDNN: ``prepack`` leaves those models alone.

Row exactness in 16 bits (``pad_single_rows``): greedy speculation is lossless only if a
verify row computes bit for bit what a decode of the same path computes. In float32 the
kernels' differences (~1e-7) practically never flip a choice; in bfloat16 they round into
different values and do. The 16-bit products here (oneDNN's packed ones and MKL's alike) give
the same row whatever the row count from 2 rows on, but a single row takes a GEMV kernel that
sums K in another order: on an AMD EPYC with AVX512-BF16 SmolLM2-135M's down_proj (K = 1,536)
differs in 5 of 36,864 outputs between 1 row and 2-16 rows, and 4 of 8 chat prompts left
target-only's greedy output within 64 tokens at k = 2. So on CPU in 16 bits a one-row product
is computed as two rows (the row twice, the first kept), and the packed weight serves every
row count (one kernel): about 1 ms per decode step of the demo target on that CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)

SIXTEEN_BIT = (torch.bfloat16, torch.float16)
DEFAULT_MIN_ROWS = 4  # where nothing was measured: MKL below this many rows, the packed weight from there
CALIBRATION_MAX_ROWS = 4  # from 4 rows on the packed weight was never the slower one on any machine measured
CALIBRATION_SAMPLE_BYTES = 256 << 20  # enough weights that the products stream them from memory, as a forward does


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Can this torch prepack a linear layer for ``device``/``dtype``?"""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and bf16_supported())


def bf16_supported() -> bool:
    """Does this CPU multiply bfloat16 natively in oneDNN (AVX512-BF16 or AMX)?"""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """An ``nn.Linear`` that multiplies by a oneDNN-prepacked copy of its weight from ``min_rows`` rows on."""

    def __init__(self, linear: nn.Linear, min_rows: int = DEFAULT_MIN_ROWS):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight  # the same Parameter: tied weights stay tied
        self.bias = linear.bias
        self.min_rows = min_rows
        self.pad_single_row = False  # pad_single_rows: a one-row product runs as two rows (row exactness)
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach())  # opaque blocked layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if x.requires_grad:
            return F.linear(x, self.weight, self.bias)
        if rows == 1 and self.pad_single_row:  # as two rows, through the path two rows take
            return _as_two_rows(x, self.packed_forward if self.min_rows <= 2 else self._mkl)
        return F.linear(x, self.weight, self.bias) if rows < self.min_rows else self.packed_forward(x)

    def _mkl(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def packed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The product through the packed weight, whatever the row count."""
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features).contiguous()  # [rows, in]
        bias = None if self.bias is None else self.bias.detach()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, bias, "none", [], "")  # [rows, out]
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, min_rows={self.min_rows}"


class PaddedLinear(nn.Module):
    """An ``nn.Linear`` whose one-row products run as two rows (the same weight: ties and state_dict unchanged)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // self.in_features == 1 and not x.requires_grad:
            return _as_two_rows(x, lambda two: F.linear(two, self.weight, self.bias))
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, one row as two"


def _as_two_rows(x: torch.Tensor, product) -> torch.Tensor:
    """``product`` of a one-row ``x`` computed on the row twice: the kernel of 2+ rows, not the GEMV one."""
    flat = x.reshape(1, x.shape[-1])
    out = product(torch.cat([flat, flat]))  # [2, out]
    return out[:1].reshape(*x.shape[:-1], out.shape[-1])


def pad_single_rows(model: nn.Module) -> int:
    """On CPU in 16 bits, make every linear of ``model`` compute a one-row product as two rows; returns how many.

    PackedLinears get the flag; plain ``nn.Linear``s become PaddedLinears. Other devices and
    dtypes are left alone (see the module docstring: row exactness).
    """
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu" or first.dtype not in SIXTEEN_BIT:
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is PackedLinear:
                child.pad_single_row = True
                count += 1
            elif type(child) is nn.Linear:
                setattr(parent, name, PaddedLinear(child))
                count += 1
    return count


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def calibrate_min_rows(
    layers: Sequence[PackedLinear],
    max_rows: int = CALIBRATION_MAX_ROWS,
    repeats: int = 3,
    sample_bytes: int = CALIBRATION_SAMPLE_BYTES,
) -> int:
    """The row count from which the packed weight is the faster path, measured on ``layers``.

    Times the layers (the first ones up to ``sample_bytes`` of weights) at 1 … ``max_rows`` rows
    through MKL and through the packed weight; returns 1 + the largest row count at which MKL was
    faster (1 when it never was, ``max_rows`` + 1 when it still was at ``max_rows``).
    """
    sample, size = [], 0
    for layer in layers:
        if size >= sample_bytes:
            break
        sample.append(layer)
        size += layer.weight.numel() * layer.weight.element_size()
    if not sample:
        return DEFAULT_MIN_ROWS
    mkl_faster_up_to = 0
    with torch.inference_mode():
        for rows in range(1, max_rows + 1):
            inputs = [torch.randn(rows, layer.in_features, dtype=layer.weight.dtype) for layer in sample]

            def mkl() -> None:
                for layer, x in zip(sample, inputs):
                    F.linear(x, layer.weight, layer.bias)

            def packed() -> None:
                for layer, x in zip(sample, inputs):
                    layer.packed_forward(x)

            mkl(), packed()  # warm both paths
            if _median_time(mkl, repeats) < _median_time(packed, repeats):
                mkl_faster_up_to = rows
    return mkl_faster_up_to + 1


def prepack(model: nn.Module, min_rows: int | None = None) -> int:
    """Swap every ``nn.Linear`` of ``model`` for a PackedLinear where that pays (CPU); returns how many.

    ``min_rows`` None: measured on the model's own layers (``calibrate_min_rows``); in 16 bits 1. A layer whose
    packed product does not match ``F.linear`` on a probe is left as it was.
    """
    first = next(model.parameters(), None)
    if first is None or not available(first.device, first.dtype):
        return 0
    swapped: list[PackedLinear] = []
    probe_rows = min_rows or DEFAULT_MIN_ROWS
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not nn.Linear:
                continue
            try:
                packed = PackedLinear(child, probe_rows)
                probe = torch.randn(probe_rows, child.in_features, dtype=child.weight.dtype)
                with torch.no_grad():
                    tol = 1e-4 if child.weight.dtype == torch.float32 else 2e-2  # bf16: rounding differs by path
                    if not torch.allclose(
                        packed.packed_forward(probe), F.linear(probe, child.weight, child.bias), rtol=tol, atol=tol
                    ):
                        continue
            except RuntimeError:  # this build's oneDNN cannot pack it: keep MKL
                continue
            setattr(parent, name, packed)
            swapped.append(packed)
    if swapped and first.dtype in SIXTEEN_BIT:
        # one kernel for every row count (row exactness, module docstring): the packed one, also at 1 row
        if min_rows not in (None, 1):
            log.warning("cpu_prepack_min_rows=%d in %s mixes two kernels: verify rows may differ from decodes",
                        min_rows, first.dtype)  # fmt: skip
        min_rows = min_rows or 1
    elif swapped and min_rows is None:
        min_rows = calibrate_min_rows(swapped)
        log.info("prepacked %d linear layers; the packed weight from %d rows on (measured)", len(swapped), min_rows)
    for layer in swapped:
        layer.min_rows = min_rows
    return len(swapped)
