"""`make demo`: the whole system on this machine, a mixed-SLO workload through the SDK, a report.

    python -m sdk.demo [--pair demo|eagle] [--draft-model ngram|suffix|PATH] [--requests 12] [--max-new-tokens 64]

1. ``services.launcher`` starts Redis, target, draft and scheduler on loopback.
   By default the draft is ``DEMO_DRAFT``: of the drafts that are prepared
   offline in seconds, the one with the highest mean accepted length on these
   prompts (measured by ``python -m bench.demo_drafts``:
   bench/results/demo-drafts/). ``--pair`` / ``--draft-model`` serve another;
   without a draft every request decodes plainly and the report says so.
2. One warm-up request alone measures this machine's TPOT; the SLO classes
   are multiples of it (tight 2x, standard 4x, relaxed 8x, plus best effort),
   so the demo means the same on a laptop and on a loaded CI box.
3. A dozen chat requests arrive together, spread over the SLO classes and
   over speculation modes (server policy, off, fixed k = 2 and 4).
4. A table per request (TTFT, TPOT, SLO met, accepted length) and totals
   (the draft served with, its mean accepted length, throughput, goodput,
   SLO attainment), then everything is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from sdk.client import AsyncClient, GenerateResult

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "Give me three tips for learning to cook.",
    "What does a compiler do?",
    "Tell me a short story about a robot who learns to paint.",
    "List the planets of the solar system.",
    "Why is the sky blue?",
    "How do I make a cup of tea?",
    "What is the difference between weather and climate?",
    "Suggest a name for a friendly cat.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is 17 times 3?",
    "Describe a sunset to someone who has never seen one.",
    "What are the primary colors?",
    "Give me a fun fact about octopuses.",
]

# (class name, TPOT target as a multiple of the lone-request TPOT; None = best effort)
SLO_CLASSES: list[tuple[str, float | None]] = [("tight", 2.0), ("standard", 4.0), ("relaxed", 8.0), ("none", None)]
SPECULATION: list[str | int] = ["auto", "off", 2, 4]


@dataclass(frozen=True)
class DemoDraft:
    label: str  # what the report names
    pair: str  # the model pair (tandem models list) whose target, and unless draft_model is set draft, serve
    draft_model: str | None = None  # a draft other than the pair's: ngram, suffix, or a model name or path


# The strongest prepared draft on QUESTIONS: the highest mean accepted length at k = 4 in
# bench/results/demo-drafts/results.json (tests/sdk/test_demo.py holds the two together).
DEMO_DRAFT = DemoDraft(label="smollm2-eagle3 (EAGLE-3 head)", pair="eagle")


@dataclass
class DemoRequest:
    question: str
    slo_class: str
    slo_tpot_ms: float | None
    speculation: str | int
    max_new_tokens: int


def chat_prompt(question: str) -> str:
    """ChatML, as SmolLM2-Instruct was trained on; the server's tokenizer parses the special tokens."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def workload(num_requests: int, base_tpot_ms: float, max_new_tokens: int) -> list[DemoRequest]:
    out = []
    for i in range(num_requests):
        name, factor = SLO_CLASSES[i % len(SLO_CLASSES)]
        out.append(
            DemoRequest(
                question=QUESTIONS[i % len(QUESTIONS)],
                slo_class=name,
                slo_tpot_ms=None if factor is None else round(factor * base_tpot_ms, 1),
                speculation=SPECULATION[(i // len(SLO_CLASSES) + i) % len(SPECULATION)],
                max_new_tokens=max_new_tokens - 8 * (i % 3),
            )
        )
    return out


async def run(address: str, num_requests: int, max_new_tokens: int) -> tuple[list[DemoRequest], list, float, float]:
    async with AsyncClient(address, timeout=600) as client:
        warm = await client.generate(chat_prompt("Say hello."), max_new_tokens=24, speculation="off")
        base_tpot_ms = max(warm.tpot_ms, 1.0)
        requests = workload(num_requests, base_tpot_ms, max_new_tokens)
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                client.generate(
                    chat_prompt(r.question),
                    max_new_tokens=r.max_new_tokens,
                    slo_tpot_ms=r.slo_tpot_ms,
                    speculation=r.speculation,
                )
                for r in requests
            ),
            return_exceptions=True,
        )
        wall_s = time.perf_counter() - start
    return requests, results, wall_s, base_tpot_ms


def report(console: Console, requests: list[DemoRequest], results: list, wall_s: float, base_tpot_ms: float,
           draft: str | None = None) -> None:
    table = Table(title="Mixed-SLO workload (times in ms; acc = tokens per verify step)", title_justify="left")
    for column in ("#", "class", "SLO", "spec", "tokens", "TTFT", "TPOT", "met", "acc", "end"):
        table.add_column(column, justify="left" if column in ("class", "spec", "end") else "right", no_wrap=True)
    ok: list[GenerateResult] = []
    for i, (req, res) in enumerate(zip(requests, results)):
        slo = "-" if req.slo_tpot_ms is None else f"{req.slo_tpot_ms:.0f}"
        spec = f"k={req.speculation}" if isinstance(req.speculation, int) else req.speculation
        if isinstance(res, BaseException):
            table.add_row(str(i), req.slo_class, slo, spec, "", "", "", "[red]error[/]", "", str(res)[:30])
            continue
        ok.append(res)
        met = "[green]yes[/]" if res.slo_attained else "[red]no[/]"
        acc = f"{res.stats.mean_accepted_length:.2f}" if res.stats.num_draft_tokens else "-"
        table.add_row(
            str(i), req.slo_class, slo, spec, str(res.num_generated), f"{res.ttft_ms:.0f}", f"{res.tpot_ms:.1f}",
            met, acc, res.finish_reason.value,
        )  # fmt: skip
    console.print(table)

    tokens = sum(r.num_generated for r in ok)
    good = sum(r.num_generated for r in ok if r.slo_attained)
    with_slo = [r for r, q in zip(results, requests) if q.slo_tpot_ms is not None and not isinstance(r, BaseException)]
    speculating = [r for r in ok if r.stats.num_draft_tokens]
    totals = Table(show_header=False, title="Totals", title_justify="left")
    totals.add_row("draft", draft or "none (plain decoding)")
    totals.add_row("requests", f"{len(ok)} of {len(requests)} finished")
    totals.add_row("lone-request TPOT (SLO unit)", f"{base_tpot_ms:.1f} ms")
    totals.add_row("wall time", f"{wall_s:.1f} s")
    totals.add_row("throughput", f"{tokens / wall_s:.1f} tokens/s ({tokens} tokens)")
    totals.add_row("goodput", f"{good / wall_s:.1f} tokens/s of SLO-meeting requests")
    if with_slo:
        met = sum(r.slo_attained for r in with_slo)
        totals.add_row("SLO attainment", f"{met}/{len(with_slo)} ({met / len(with_slo):.0%}) of requests with an SLO")
    if speculating:
        accepted = sum(r.stats.num_accepted_tokens for r in speculating)
        drafted = sum(r.stats.num_draft_tokens for r in speculating)
        steps = sum(r.stats.num_steps for r in speculating)
        totals.add_row("acceptance (speculating)", f"{accepted / drafted:.0%} of {drafted} draft tokens")
        totals.add_row("mean accepted length", f"{(accepted + steps) / steps:.2f} tokens per step")
    console.print(totals)
    if ok:
        console.print(f"[dim]request 0 answered:[/] {ok[0].text.strip()[:200]!r}")


def demo_draft(pair: str | None, draft_model: str | None) -> DemoDraft:
    """DEMO_DRAFT unless the command line names a pair or a draft; then that pair's draft, or the one named."""
    if pair is None and draft_model is None:
        return DEMO_DRAFT
    pair = pair or DEMO_DRAFT.pair
    if draft_model:
        return DemoDraft(label=draft_model, pair=pair, draft_model=draft_model)
    from shared.models.registry import PAIRS

    known = PAIRS.get(pair)
    return DemoDraft(label=known.draft.name if known and known.draft else f"the {pair} pair's draft", pair=pair)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdk.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=None, help=f"model pair (tandem models list); default: {DEMO_DRAFT.pair}, "
                        f"serving {DEMO_DRAFT.label}")  # fmt: skip
    parser.add_argument("--draft-model", default=None, help="a draft other than the pair's: ngram, suffix, a model")
    parser.add_argument("--requests", type=int, default=12, help="concurrent requests (default 12)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="longest answer (default 64)")
    args = parser.parse_args(argv)
    draft = demo_draft(args.pair, args.draft_model)

    from services.launcher import LaunchConfig, LaunchError, launch  # the services pull in torch
    from shared.models import registry
    from shared.models.paths import Paths

    console = Console()
    if draft.pair in registry.PAIRS:  # idempotent: seconds when prepared (make demo prepares the demo pair)
        registry.prepare(registry.PAIRS[draft.pair], Paths.resolve(None), console)
    console.print(f"[bold]Tandem demo[/]: starting Redis, target, draft and scheduler ({draft.pair} pair, "
                  f"draft {draft.label}) ...")  # fmt: skip
    t = time.perf_counter()
    try:
        with launch(LaunchConfig(pair=draft.pair, draft_model=draft.draft_model, port=0, metrics_port=0)) as stack:
            e = stack.endpoints
            console.print(
                f"up in {time.perf_counter() - t:.0f} s: scheduler {e.scheduler}, target {e.target}, "
                f"draft {e.draft or 'none (speculation off for everyone)'}, metrics {e.metrics_url}"
            )
            console.print(f"serving {args.requests} concurrent requests ...")
            requests, results, wall_s, base = asyncio.run(run(e.scheduler, args.requests, args.max_new_tokens))
            report(console, requests, results, wall_s, base, draft=draft.label if e.draft else None)
            console.print("stopping ...")
    except LaunchError as exc:
        console.print(f"[red]could not start the stack:[/] {exc}")
        return 1
    return 0 if all(not isinstance(r, BaseException) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
