"""Helpers of the GPU tests (tests/gpu): strict mode and optional imports.

Under `make gpu-check` (TANDEM_GPU_STRICT=1) a missing optional piece (flashinfer, the prepared demo
pair) fails a test instead of skipping it: on the GPU machine the kit installed them, and a skip
there would hide that it did not.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

STRICT_ENV = "TANDEM_GPU_STRICT"
# The device the GPU tests run on. Only for smoke-running their code paths on a CPU while writing
# them (TANDEM_GPU_TEST_DEVICE=cpu; flashinfer cases then skip); they assert what they must on CUDA.
DEVICE = os.environ.get("TANDEM_GPU_TEST_DEVICE", "cuda")
requires_device = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")


def strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def need_module(name: str):
    """Import ``name``; skip the test when it is missing (fail under TANDEM_GPU_STRICT)."""
    if DEVICE != "cuda" and name == "flashinfer":
        pytest.skip("flashinfer runs on CUDA only")
    if strict():
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=f"{name} is not installed (GPU-only optional dependency)")


def missing(message: str) -> None:
    """Skip (fail under TANDEM_GPU_STRICT) for a missing prerequisite."""
    if strict():
        pytest.fail(message)
    pytest.skip(message)
