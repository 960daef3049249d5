"""Which flashinfer kernel family each batch kind gets (pure; runs on CPU).

A wrapper built with backend="auto" keeps the family of its first plan, so a causal prefill on Hopper
pinned FA3 and a later tree batch's custom mask failed there ("operation not supported", H100,
bench/results/gpu-check-h100). The backend now builds one wrapper per mask kind with an explicit family.
"""

import pytest
import torch

from shared.engine.attention.base import select_backend
from shared.engine.attention.flashinfer_backend import SUPPORTED_HEAD_DIMS, kernel_family

HOPPER, AMPERE, BLACKWELL = (9, 0), (8, 0), (10, 0)


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_causal_batches_take_fa3_on_hopper_only(head_dim):
    assert kernel_family(True, head_dim, HOPPER) == "fa3"
    assert kernel_family(True, head_dim, AMPERE) == "fa2"
    assert kernel_family(True, head_dim, BLACKWELL) == "fa2"


@pytest.mark.parametrize("capability", [HOPPER, AMPERE, BLACKWELL])
def test_tree_masks_always_take_fa2(capability):
    # FA3 has no custom-mask kernel: a tree must never reach it, whatever ran before
    for head_dim in SUPPORTED_HEAD_DIMS:
        assert kernel_family(False, head_dim, capability) == "fa2"


def test_head_dims_without_fa3_kernels_take_fa2():
    assert kernel_family(True, 16, HOPPER) == "fa2"


class _Cache:
    def __init__(self, head_dim, dtype):
        self.kv = torch.zeros(1, 2, 4, 1, head_dim, dtype=dtype)  # [L, 2, slots, Hkv, D]


def test_auto_stays_on_sdpa_without_cuda_or_for_head_dims_flashinfer_lacks():
    assert select_backend("auto", _Cache(64, torch.bfloat16), torch.device("cpu")).name == "sdpa"
    # head dim 16 (the tiny test models): no flashinfer kernels, whatever the device
    assert select_backend("auto", _Cache(16, torch.bfloat16), torch.device("cuda")).name == "sdpa"
