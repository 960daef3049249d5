"""The one-line summary `tandem generate` and `tandem chat` print after each answer.

    24 tokens (eos), TTFT 41.2 ms, TPOT 18.3 ms, 2.41 tokens/step, acceptance 71%, SLO met
"""

from __future__ import annotations

from sdk.types import GenerateResult


def stats_line(result: GenerateResult, *, slo: bool = False) -> str:
    """``slo``: the request had a latency target, so whether it was met is worth a word."""
    line = (
        f"{result.num_generated} tokens ({result.finish_reason}), TTFT {result.ttft_ms:.1f} ms, "
        f"TPOT {result.tpot_ms:.1f} ms, {result.stats.mean_accepted_length:.2f} tokens/step, "
        f"acceptance {result.stats.acceptance_rate:.0%}"
    )
    return line + (f", SLO {'met' if result.slo_attained else 'missed'}" if slo else "")
