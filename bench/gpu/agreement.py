"""Greedy output against a reference, with the near-tie rule the GPU tests enforce (pure; no torch).

Two implementations of the same model round differently (other kernels, other batch shapes), so
greedy outputs may part where the two best logits are nearly equal. The rule::

    δ        the largest |logit difference| between the two, teacher-forced on the reference's own
             tokens (both see the same context, so δ is rounding alone), over every position compared
    margin   the reference's top-1 minus top-2 logit at a position

    equal outputs                                            pass
    first difference at i, margin(i) <= 2 max(δ, floor(i))   pass: a near-tie (each side may move by δ)
    first difference at i, margin(i) >  2 max(δ, floor(i))   fail: not explained by rounding
    δ > max(DELTA_MAX[dtype], 2 noise)                        fail: the kernels disagree beyond rounding

noise (optional): the reference's own rounding error, the largest |logit difference| between the
reference and the same model in float32, teacher-forced on the same tokens. Two implementations of
one dtype, each up to ``noise`` away from float32, may be ``2 noise`` apart with neither wrong.

Nothing after the first difference is compared: from there on the contexts differ. The fixed bounds
on δ are loose on purpose (they catch broken kernels, not slow drift): float32 1e-2 logits, bfloat16
1.0, float16 0.5 (SmolLM2's logits are of order 10-30; one bf16 ulp there is 0.06-0.12). In bfloat16
1.0 turned out to be bf16's own noise, not a margin above it: on an H200 (2026-11-27,
``python -m bench.gpu.bf16_noise``, bench/results/gpu-check-h200) HF's bf16 SDPA was up to 0.81 logits
from float32 on the greedy tests' prompts, HF's own eager attention up to 1.0 from its SDPA, and
Tandem's flashinfer path 0.69-1.05 from HF's SDPA. Hence the noise term, measured per prompt: a
broken kernel moves logits by several units, far beyond twice the noise.

δ is measured on one path (a verify of the reference as a chain), while the output came from
another (batched decode steps, or speculation), which rounds differently; so δ counts as at least
a floor: two units in the last place of the top logit there (|top| x 2^-7 in bfloat16, 2^-10 in
float16, 2^-22 in float32), and no less than float32 1e-4, bfloat16 0.125, float16 0.03. Seen on a
CPU: bf16 SDPA's teacher-forced logits equal HF's exactly (δ = 0) while its batched decode parted
from HF where the margin was 0.0625 to 0.25, one ulp of logits of 16 to 64.
"""

from __future__ import annotations

from dataclasses import dataclass

DELTA_MAX = {"float32": 1e-2, "bfloat16": 1.0, "float16": 0.5}
DELTA_FLOOR = {"float32": 1e-4, "bfloat16": 0.125, "float16": 0.03}
ULPS_FLOOR = {"float32": 2.0**-22, "bfloat16": 2.0**-7, "float16": 2.0**-10}  # 2 ulps, relative to |top logit|
TIE_FACTOR = 2.0
NOISE_FACTOR = 2.0  # two implementations, each up to `noise` away from float32


@dataclass(frozen=True)
class Agreement:
    equal: bool
    passed: bool
    diverged_at: int | None  # first generated position that differs
    margin: float | None  # the reference's top-2 margin there
    delta: float  # largest |logit difference| measured on the shared prefix
    reason: str
    noise: float | None = None  # the reference's own distance from float32, when measured

    def as_dict(self) -> dict:
        return {"equal": self.equal, "passed": self.passed, "diverged_at": self.diverged_at, "margin": self.margin,
                "delta": self.delta, "noise": self.noise, "reason": self.reason}  # fmt: skip


def first_divergence(got: list[int], ref: list[int]) -> int | None:
    """The first index where the two differ (a shorter list differs where it ends); None if equal."""
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            return i
    return None if len(got) == len(ref) else min(len(got), len(ref))


def judge(got: list[int], ref: list[int], *, margins: list[float], delta: float, dtype: str,
          tops: list[float] | None = None, noise: float | None = None) -> Agreement:  # fmt: skip
    """Apply the rule; ``margins[i]``: the reference's top-2 margin at generated position i, ``tops[i]``
    its top logit there (for the floor in ulps; without them only the absolute floor applies);
    ``noise``: the reference's own distance from float32 (without it only the fixed bound applies)."""
    limit = max(DELTA_MAX[dtype], NOISE_FACTOR * noise if noise is not None else 0.0)

    def verdict(equal: bool, passed: bool, at: int | None, margin: float | None, reason: str) -> Agreement:
        return Agreement(equal, passed, at, margin, delta, reason, noise)

    if delta > limit:
        allowed = f"{limit:.4g} allowed for {dtype}" + (f" (2 x its own noise {noise:.4g})" if noise else "")
        return verdict(False, False, first_divergence(got, ref), None, f"logits differ by {delta:.4g} > {allowed}: "
                       "beyond rounding")  # fmt: skip
    i = first_divergence(got, ref)
    if i is None:
        return verdict(True, True, None, None, "equal")
    if i >= len(margins):
        return verdict(False, False, i, None, f"differs at {i}, past the {len(margins)} margins known")
    margin = float(margins[i])
    floor = max(DELTA_FLOOR[dtype], abs(float(tops[i])) * ULPS_FLOOR[dtype] if tops else 0.0)
    bound = TIE_FACTOR * max(delta, floor)
    if margin <= bound:
        return verdict(False, True, i, margin, f"near-tie at {i}: margin {margin:.4g} <= {bound:.4g}")
    return verdict(False, False, i, margin, f"differs at {i} where the margin {margin:.4g} > {bound:.4g}")
