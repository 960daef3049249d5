"""Engine benchmark: Tandem's target engine vs HF ``generate``, and the cost of verifying k tokens.

    python -m bench.engine_bench [--threads 2] [--new-tokens 48] [--repeats 3] [--out bench/results/engine_cpu.json]

Two measurements on SmolLM2-135M-Instruct (the demo target), same process, same
prompts, configurations interleaved and repeated (median reported) so the
ratios hold on a noisy machine:

1. Plain greedy decoding throughput at batch 1 and 16: ``TargetEngine``
   (prefill, then verify steps with empty trees) vs ``model.generate`` with its
   KV cache. Both count prefill + ``new_tokens`` per request; the first tokens
   of both are compared as a sanity check.
2. Verify cost: one forward that verifies a k-token chain (k = 4, 8, 16, 32)
   per request, relative to one plain decode forward, at batch 1 and 8. This
   is the T(k)/T(0) that SmartSpec's goodput model needs.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import typer
from rich.console import Console
from rich.table import Table

from shared.engine.config import EngineConfig
from shared.engine.loading import load_causal_lm
from shared.engine.runner import ModelRunner, Work
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem
from shared.models import smollm2
from shared.models.paths import Paths

PROMPTS = [
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short poem about the sea at night.",
    "What are the main differences between Python lists and tuples?",
    "Give me three tips for a good night's sleep.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How does a refrigerator keep food cold?",
    "Write a Python function that reverses a string.",
    "What is the capital of Australia, and why was it chosen?",
    "Describe the water cycle step by step.",
    "List five fruits that are rich in vitamin C.",
    "Why do cats purr?",
    "Explain recursion with a simple example.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines train the immune system?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What is the difference between weather and climate?",
]
VERIFY_KS = (4, 8, 16, 32)

app = typer.Typer(add_completion=False)


def encode(tokenizer, n: int) -> list[list[int]]:
    prompts = (PROMPTS * (n // len(PROMPTS) + 1))[:n]
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in prompts
    ]


def as_ids(encoded) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True)
    return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)


def tandem_decode(engine: TargetEngine, prompts: list[list[int]], new_tokens: int, tag: str) -> list[list[int]]:
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    firsts = engine.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)])
    out = [[r.first_token] for r in firsts]
    empty = TokenTree(token_ids=[], parent_ids=[])
    for _ in range(new_tokens - 1):
        for o, r in zip(out, engine.verify([VerifyItem(s, empty) for s in ids])):
            o.extend(r.tokens)
    engine.release(ids)
    return out


def hf_decode(model, tokenizer, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=input_ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad,
    )
    return out[:, width:].tolist()


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def verify_cost(runner: ModelRunner, prompts: list[list[int]], batch: int, repeats: int) -> dict[int, float]:
    """Median seconds of one forward verifying a k-chain per request (k = 0 is a plain decode step)."""
    seqs = [runner.add(f"v{batch}-{i}", p) for i, p in enumerate(prompts[:batch])]
    runner.forward([Work(s) for s in seqs])  # prefixes cached
    times: dict[int, list[float]] = {k: [] for k in (0, *VERIFY_KS)}
    gen = torch.Generator().manual_seed(0)
    for _ in range(repeats):
        for k in times:  # interleaved: every k sees the same machine state
            works = [
                Work(
                    s,
                    new_nodes=[(int(t), j - 1) for j, t in enumerate(torch.randint(runner.vocab_size, (k,), generator=gen))],
                    want_root=True,
                    want_nodes=True,
                )
                for s in seqs
            ]
            seconds, _ = timed(lambda: runner.forward(works))
            for s in seqs:
                runner.commit(s, [])  # roll back: the prefix stays the same for every k
            times[k].append(seconds)
    for s in seqs:
        runner.release(s.seq_id)
    return {k: statistics.median(v) for k, v in times.items()}


@app.command()
def main(
    threads: int = typer.Option(2, help="torch intra-op threads (the issue asks for 2)."),
    new_tokens: int = typer.Option(48, help="Tokens generated per request in the decode comparison."),
    repeats: int = typer.Option(3, help="Interleaved repetitions; medians are reported."),
    out: Path = typer.Option(Path("bench/results/engine_cpu.json"), help="Where the JSON results go."),
    home: Path | None = typer.Option(None, help="TANDEM_HOME holding the prepared demo models."),
) -> None:
    console = Console()
    torch.set_num_threads(threads)
    source = smollm2.model_dir(Paths.resolve(home))
    if not source.exists():
        raise typer.BadParameter(f"{source} is missing; run `make models` (tandem models prepare --pair demo) first")
    tandem_model = load_causal_lm(source, dtype="float32", device="cpu")
    hf = load_causal_lm(source, dtype="float32", device="cpu")
    tokenizer = hf.tokenizer
    engine = TargetEngine(ModelRunner(tandem_model.model, EngineConfig(block_size=16, num_blocks=2048)))
    prompts = [as_ids(e) for e in encode(tokenizer, 16)]

    results: dict = {
        "command": "make bench-engine  (python -m bench.engine_bench)",
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "torch": torch.__version__,
            "threads": threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        },
        "model": source.name,
        "dtype": "float32",
        "new_tokens": new_tokens,
        "repeats": repeats,
        "decode": {},
        "verify_cost": {},
    }

    # warm-up: one short run of each so lazy initialisation is not timed
    tandem_decode(engine, prompts[:2], 4, "warm")
    hf_decode(hf.model, tokenizer, prompts[:2], 4)

    table = Table(title=f"Plain greedy decoding, SmolLM2-135M fp32, {threads} threads, {new_tokens} new tokens/request")
    for col in ("batch", "Tandem tok/s", "HF generate tok/s", "ratio", "first tokens equal"):
        table.add_column(col, justify="right")
    for batch in (1, 16):
        batch_prompts = prompts[:batch]
        t_times, h_times = [], []
        for r in range(repeats):
            t_s, t_out = timed(lambda: tandem_decode(engine, batch_prompts, new_tokens, f"b{batch}r{r}"))
            h_s, h_out = timed(lambda: hf_decode(hf.model, tokenizer, batch_prompts, new_tokens))
            t_times.append(t_s)
            h_times.append(h_s)
        n = batch * new_tokens
        agree = sum(a[:8] == b[:8] for a, b in zip(t_out, h_out))
        row = {
            "tandem_tok_s": n / statistics.median(t_times),
            "hf_tok_s": n / statistics.median(h_times),
            "tandem_s": t_times,
            "hf_s": h_times,
            "first8_equal": f"{agree}/{batch}",
        }
        row["ratio"] = row["tandem_tok_s"] / row["hf_tok_s"]
        results["decode"][str(batch)] = row
        table.add_row(str(batch), f"{row['tandem_tok_s']:.1f}", f"{row['hf_tok_s']:.1f}", f"{row['ratio']:.2f}×", row["first8_equal"])
    console.print(table)

    vtable = Table(title="Verify cost: one forward with a k-token chain per request, relative to one decode step")
    vtable.add_column("batch", justify="right")
    vtable.add_column("decode ms", justify="right")
    for k in VERIFY_KS:
        vtable.add_column(f"k={k}", justify="right")
    for batch in (1, 8):
        cost = verify_cost(engine.runner, prompts, batch, max(5, repeats * 2))
        results["verify_cost"][str(batch)] = {
            "decode_ms": cost[0] * 1e3,
            **{f"k{k}": cost[k] / cost[0] for k in VERIFY_KS},
        }
        vtable.add_row(str(batch), f"{cost[0] * 1e3:.1f}", *[f"{cost[k] / cost[0]:.2f}×" for k in VERIFY_KS])
    console.print(vtable)

    engine.runner.check_accounting()
    results["machine"]["load_average_at_end"] = os.getloadavg()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"results written to {out}")


if __name__ == "__main__":
    app()
