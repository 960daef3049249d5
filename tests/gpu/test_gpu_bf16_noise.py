"""bf16's own noise on the GPU (bench/gpu/bf16_noise.py): the scale the greedy tests' δ bound sits on.

Recorded into gpu-check's measurements so each GPU run states it beside the δ it judged. The test
asserts only what must hold of any sound bf16 model: every difference is finite, non-zero (bf16
rounds) and small against the logits (a few per cent of the top logit, never a broken kernel's).
"""

import math

import pytest

from bench.gpu.results import record_measurement
from tests.gpu.support import DEVICE, requires_device

pytestmark = [pytest.mark.gpu, requires_device]


def test_bf16_noise_of_the_demo_target(demo_pair):
    from bench.gpu.bf16_noise import measure

    found = measure(demo_pair[0], DEVICE, num_prompts=2, new_tokens=24)
    record_measurement("bf16-noise", found)
    for row in found["prompts"]:
        for name, value in row.items():
            if " vs " in name:
                assert math.isfinite(value) and 0 < value < 0.1 * row["top_abs_max"], (name, row)
