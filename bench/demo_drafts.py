"""Which prepared draft `make demo` should serve with: each one's mean accepted length on the demo's prompts.

    python -m bench.demo_drafts [--ks 4] [--prompts 12] [--max-new-tokens 64]    # results: bench/results/demo-drafts/

Every draft that can be prepared offline in seconds, on the demo's target (SmolLM2-135M-Instruct) and the
demo's own prompts (the first ``--prompts`` of sdk.demo.QUESTIONS, the twelve `make demo` sends, in the chat
template, greedy, as the demo sends them):

    smollm2-draft        the demo pair's distilled small draft (3 target layers + LoRA)
    smollm2-eagle3       the EAGLE-3 head over the target's features (the eagle pair; committed weights)
    ngram, suffix        model-free drafts (prompt lookup; suffix trees over the request and recent outputs)

One stack per draft and chain length k (a suffix draft remembers what it served: a second pass over the
same prompts would be answered from memory), the prompts one at a time, each once. The figure is the
demo report's: (accepted draft tokens + verify steps) / verify steps, pooled over the prompts. Acceptance
does not depend on timing (greedy verification is deterministic), so no repeats: one pass is the value.
The winner at the demo's longest chain is sdk.demo.DEMO_DRAFT (tests/sdk/test_demo.py checks it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bench.run_info import machine
from sdk.client import AsyncClient
from sdk.demo import QUESTIONS, chat_prompt

OUT = Path(__file__).resolve().parent / "results" / "demo-drafts"
# (label, pair, draft_model override): the pair's draft when the override is None
DRAFTS = (("smollm2-draft", "demo", None), ("smollm2-eagle3", "eagle", None), ("ngram", "demo", "ngram"),
          ("suffix", "demo", "suffix"))  # fmt: skip


async def _measure(address: str, k: int, num_prompts: int, max_new_tokens: int) -> dict:
    steps = accepted = drafted = tokens = 0
    async with AsyncClient(address, timeout=600) as client:
        for question in QUESTIONS[:num_prompts]:
            res = await client.generate(chat_prompt(question), max_new_tokens=max_new_tokens, speculation=k)
            steps += res.stats.num_steps
            accepted += res.stats.num_accepted_tokens
            drafted += res.stats.num_draft_tokens
            tokens += res.num_generated
    return {"k": k, "prompts": num_prompts, "tokens": tokens, "verify_steps": steps, "draft_tokens": drafted,
            "accepted_tokens": accepted, "acceptance": accepted / max(drafted, 1),
            "mean_accepted_length": (accepted + steps) / max(steps, 1)}  # fmt: skip


def measure(ks: list[int], num_prompts: int, max_new_tokens: int, home: Path | None, console: Console) -> list[dict]:
    from services.launcher import LaunchConfig, launch
    from shared.models import registry
    from shared.models.paths import Paths

    rows = []
    for label, pair, draft_model in DRAFTS:
        registry.prepare(registry.PAIRS[pair], Paths.resolve(home), console)
        for k in ks:
            config = LaunchConfig(pair=pair, draft_model=draft_model, port=0, metrics_port=0, home=home)
            with launch(config) as stack:
                row = {"draft": label, "pair": pair, "draft_model": draft_model,
                       **asyncio.run(_measure(stack.endpoints.scheduler, k, num_prompts, max_new_tokens))}  # fmt: skip
            console.print(f"{label} k={k}: mean accepted length {row['mean_accepted_length']:.2f} "
                          f"(acceptance {row['acceptance']:.0%} of {row['draft_tokens']})")  # fmt: skip
            rows.append(row)
    return rows


def best(rows: list[dict]) -> str:
    """The draft with the highest mean accepted length at the longest chain measured."""
    k = max(r["k"] for r in rows)
    return max((r for r in rows if r["k"] == k), key=lambda r: r["mean_accepted_length"])["draft"]


def readme(results: dict) -> str:
    rows = results["rows"]
    ks = sorted({r["k"] for r in rows})
    head = "| draft | " + " | ".join(f"k = {k}: tokens/step (acceptance)" for k in ks) + " |"
    lines = [head, "|---|" + "---|" * len(ks)]
    for label in dict.fromkeys(r["draft"] for r in rows):
        cells = [next(f"{r['mean_accepted_length']:.2f} ({r['acceptance']:.0%} of {r['draft_tokens']})"
                      for r in rows if r["draft"] == label and r["k"] == k) for k in ks]  # fmt: skip
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    m = results["machine"]
    return "\n".join([
        "# demo-drafts: the prepared drafts on the demo's prompts", "",
        f"Command: `{results['command']}`  ", f"Machine: {m.get('cpu_model') or m.get('processor')}, {m.get('cpu_count')} cores  ",
        f"Date: {results['date']}  ", f"Commit: {results['commit']}", "",
        f"Each prepared draft on SmolLM2-135M-Instruct over the demo's {rows[0]['prompts']} prompts (sdk/demo.py, chat "
        "template, greedy, one at a time), one stack per draft and k; tokens/step = (accepted + steps) / steps, the "
        "figure the demo prints. Method: bench/demo_drafts.py.", "",
        *lines, "",
        f"Highest at k = {ks[-1]}: **`{results['best']}`**, the draft `make demo` serves with (sdk.demo.DEMO_DRAFT).", "",
    ])  # fmt: skip


def main(
    ks: str = typer.Option("4", help="Chain lengths, comma-separated (the demo's longest chain and its server "
                           "policy's, fixed:4)."),
    prompts: int = typer.Option(12, help="How many of the demo's questions (the demo sends the first 12)."),
    max_new_tokens: int = typer.Option(64, help="Longest answer (the demo's default)."),
    home: Path | None = typer.Option(None, help="Tandem home (default $TANDEM_HOME or ~/.cache/tandem)."),
) -> None:
    console = Console()
    started = time.time()
    rows = measure([int(k) for k in ks.split(",") if k.strip()], prompts, max_new_tokens, home, console)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"command": f"python -m bench.demo_drafts --ks {ks} --prompts {prompts} --max-new-tokens {max_new_tokens}", "commit": commit,
               "date": datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": machine(0), "rows": rows, "best": best(rows)}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / "README.md").write_text(readme(results))
    table = Table("draft", "k", "tokens/step", "acceptance")
    for r in rows:
        table.add_row(r["draft"], str(r["k"]), f"{r['mean_accepted_length']:.2f}", f"{r['acceptance']:.0%}")
    console.print(table)
    console.print(f"best: {results['best']}; results in {OUT}")


if __name__ == "__main__":
    typer.run(main)
