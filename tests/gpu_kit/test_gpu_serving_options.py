"""The GPU serving stages' presets (bench/gpu/serving.py): shortened to fit a device call, interleaved so
that every stack starts at once."""

from __future__ import annotations

from bench.gpu.serving import options
from bench.harness import FASER_SWEEP, SLO_SWEEP


def test_slo_preset_fits_a_call_and_interleaves():
    opts = options("slo", "demo", long=False, budget_s=270, device="cpu")
    assert opts.interleave and opts.sweep_requests == 12
    assert opts.sweep == [c for c in SLO_SWEEP if not c.startswith("policy:adaserve:")]  # six stacks fit the call
    assert "policy:adaserve" in opts.sweep and len(opts.sweep) == 6
    assert opts.rate_factors == [2.0, 4.0] and opts.stringent_shares == []
    assert options("slo", "demo", long=False, budget_s=150, device="cpu").rate_factors == [3.0]  # one load
    assert opts.models.dtype == "float32"
    assert options("slo", "demo", long=False, budget_s=270).models.dtype == "bfloat16"  # cuda


def test_faser_preset_is_batch_one_and_interleaves():
    opts = options("faser", "demo", long=False, budget_s=230, device="cpu")
    assert opts.interleave and opts.batch1 == list(FASER_SWEEP) and opts.sweep == []
    assert (opts.num_prompts, opts.max_new_tokens, opts.repeats) == (4, 64, 1)
