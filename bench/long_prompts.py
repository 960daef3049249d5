"""Long-prompt arrivals: requests with prompts of thousands of tokens among a load point's Poisson traffic.

A long prompt's prefill is what chunked prefill is for: prefilled in one piece, it stalls every running
request's next token for the whole prefill; in chunks, it shares each step's forward and token budget with
the running requests' verify trees. The long requests themselves ask for few tokens under the relaxed
TPOT SLO (their class is ``long``, so attainment by class tells them apart from the traffic they interrupt).

Their prompts are stdlib module docstrings (bench/prompts.py's summarisation pool) joined until the text
certainly holds ``tokens`` tokens; the encoder then keeps its last ``tokens`` (the chat template's end intact).
"""

from __future__ import annotations

import random

from bench import prompts as prompt_sets
from bench.slo import RELAXED, SloClass
from bench.workload import WorkItem

LONG = SloClass("long", RELAXED.tpot_factor)
CHARS_PER_TOKEN_BOUND = 8  # no tokenizer packs more characters than this into one token of English prose or code


def long_items(n: int, *, tokens: int, window_s: float, first_index: int, max_new_tokens: int,
               seed: int = 0) -> list[WorkItem]:  # fmt: skip
    """``n`` long-prompt items arriving evenly over ``window_s`` seconds (at the middles of n equal slices)."""
    if n < 0 or tokens < 1 or window_s < 0 or max_new_tokens < 1:
        raise ValueError("long prompts: n >= 0, tokens >= 1, window >= 0 and max_new_tokens >= 1")
    pool = [p.text for p in prompt_sets.load("summarize", 64, seed)]
    rng = random.Random(seed)
    items = []
    for i in range(n):
        parts, size = ["Summarise the following documents, reusing their own wording where you can:"], 0
        while size < CHARS_PER_TOKEN_BOUND * tokens:
            doc = rng.choice(pool).split("\n\n", 1)[-1]  # the docstring without the instruction in front
            parts.append(doc)
            size += len(doc)
        prompt = prompt_sets.Prompt("long", "\n\n".join(parts))
        items.append(WorkItem(first_index + i, window_s * (i + 0.5) / n, prompt, LONG, max_new_tokens))
    return items
