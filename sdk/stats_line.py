"""The one-line summary `tandem generate` and `tandem chat` print after each answer, and `--logprobs`' table.

    24 tokens (eos), TTFT 41.2 ms, TPOT 18.3 ms, 2.41 tokens/step, acceptance 71%, SLO met

    #     token     logprob   top alternatives (token:logprob)
    0     3838      -0.0412   3838:-0.0412 2685:-3.5021
"""

from __future__ import annotations

from collections.abc import Sequence

from sdk.types import GenerateResult, TokenLogprob


def stats_line(result: GenerateResult, *, slo: bool = False) -> str:
    """``slo``: the request had a latency target, so whether it was met is worth a word."""
    line = (
        f"{result.num_generated} tokens ({result.finish_reason}), TTFT {result.ttft_ms:.1f} ms, "
        f"TPOT {result.tpot_ms:.1f} ms, {result.stats.mean_accepted_length:.2f} tokens/step, "
        f"acceptance {result.stats.acceptance_rate:.0%}"
    )
    return line + (f", SLO {'met' if result.slo_attained else 'missed'}" if slo else "")


def logprobs_table(logprobs: Sequence[TokenLogprob]) -> str:
    """One line per generated token: position, token id, its log-probability, the alternatives (ids: the wire
    carries no per-token text)."""
    lines = [f"{'#':<5} {'token':<9} {'logprob':<9} top alternatives (token:logprob)"]
    for i, lp in enumerate(logprobs):
        top = " ".join(f"{a.token_id}:{a.logprob:.4f}" for a in lp.top)
        lines.append(f"{i:<5} {lp.token_id:<9} {lp.logprob:<9.4f} {top}".rstrip())
    return "\n".join(lines)
