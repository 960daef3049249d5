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
import statistics

from bench import prompts as prompt_sets
from bench.slo import RELAXED, SloClass
from bench.tokens import EncodedItem, PromptEncoder
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


def encoded_long_items(opts, encoder: PromptEncoder, window_s: float, seed: int, first_index: int = 0,
                       n: int | None = None) -> list[EncodedItem]:  # fmt: skip
    """``n`` (default ``opts.long_prompts``) long-prompt arrivals spread over ``window_s``, numbered from
    ``first_index``, encoded to exactly ``opts.long_prompt_tokens`` tokens with the run's tokenizer."""
    longs = long_items(opts.long_prompts if n is None else n, tokens=opts.long_prompt_tokens, window_s=window_s,
                       first_index=first_index, max_new_tokens=opts.long_max_new_tokens, seed=opts.seed + seed)  # fmt: skip
    return PromptEncoder(encoder.tokenizer, encoder.vocab_size, opts.long_prompt_tokens).encode_all(longs)


async def measure_long_baseline(run, send, requests) -> None:
    """A lone long prompt's TTFT, target-only (its prefill, nothing else running), on the harness ``run``: the
    long class's TTFT SLO is ``long_ttft_factor`` times it, scaled to the machine as the TPOT classes are."""
    from bench.configs import parse
    from bench.drivers import Job

    ttfts = []
    for i in range(2):  # a fresh prompt each time, under its own salt: never served from the prefix cache
        (item,) = encoded_long_items(run.opts, run.encoder, 0.0, seed=556 + i, n=1)
        job = Job(item, None, f"target-only/long-baseline-{i}", cache_salt=f"long-baseline-{i}")
        res = await run._send("baseline", "batch=1", parse("target-only"), [job], {"target-only": send}, requests,
                              "closed")  # fmt: skip
        ttfts += [r.trace.ttft_s for r in res.records if r.trace.ttft_s is not None]
    if not ttfts:
        raise RuntimeError("target-only produced no first token for a long prompt: cannot set its TTFT SLO")
    run.long_baseline_ttft_s = statistics.median(ttfts)
    run.long_ttft_slo_ms = run.opts.long_ttft_factor * run.long_baseline_ttft_s * 1e3
    run.log(f"long prompts: lone TTFT {run.long_baseline_ttft_s:.2f} s, TTFT SLO {run.long_ttft_slo_ms / 1e3:.2f} s")
