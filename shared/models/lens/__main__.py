"""Train the demo target's tuned lens on this machine and write the committed file.

    python -m shared.models.lens [--prompts 400] [--layers 14,16,...,28] [--epochs 1]

    distill corpus prompts (bench prompts excluded)
      ──target greedy answers (cached under <home>/lens-data)──▶ teacher-forced hidden states (data.py)
      ──train.py: one translator per layer, KL to the last layer──▶ held-out KL and top-K agreement
      ──▶ shared/models/weights/smollm2-lens/tuned_lens.safetensors (+ report.json)

``tandem models prepare`` copies the committed lens next to the target, where
the target service's early exit finds it (``TANDEM_EARLY_EXIT=on:lens=auto``).
"""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from datetime import date
from pathlib import Path

import torch
import typer
from rich.console import Console

from shared.engine.tuned_lens import TunedLens
from shared.models.lens import data, train

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights" / "smollm2-lens"
DEFAULT_LAYERS = "14,16,18,20,22,24,26,28"

app = typer.Typer(add_completion=False)


@app.command()
def main(
    prompts: int = typer.Option(400, help="Corpus prompts to answer (about 8 % are held out for the report)."),
    layers: str = typer.Option(DEFAULT_LAYERS, help="Decoder layers (0-based, the state after the layer) to train."),
    epochs: float = typer.Option(1.0, help="Passes over the training rows per layer."),
    lr: float = typer.Option(1e-3),
    vocab: int = typer.Option(8192, help="Exit test ranks among the target's N most frequent choices (0: whole vocabulary)."),
    max_new_tokens: int = typer.Option(128),
    threads: int = typer.Option(2),
    out: Path = typer.Option(WEIGHTS_DIR, help="Where the lens and its report are written."),
    home: str = typer.Option(None, help="Tandem home (default ~/.cache/tandem)."),
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared.models import smollm2
    from shared.models.distill import corpus, generate
    from shared.models.eagle.__main__ import exclude_bench
    from shared.models.paths import Paths

    console = Console()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    started = time.time()
    paths = Paths.resolve(home)
    target_dir = smollm2.prepare(paths, console)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.bfloat16, local_files_only=True).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    wanted = sorted({int(x) for x in layers.split(",") if x.strip()})
    last = model.config.num_hidden_layers - 1
    if not wanted or wanted[0] < 0 or wanted[-1] >= last:
        raise typer.BadParameter(f"layers must lie in 0..{last - 1} (the last layer reads its own output)", param_hint="--layers")
    pool = exclude_bench(corpus.build(prompts))
    samples = generate.generate(model, tokenizer, pool, paths.home / "lens-data", max_new_tokens=max_new_tokens,
                                tag=smollm2.NAME + "-bf16")  # fmt: skip
    t0 = time.perf_counter()
    fit_set = data.hidden_states(model, [s for s in samples if not s.heldout], wanted)
    held_set = data.hidden_states(model, [s for s in samples if s.heldout], wanted)
    console.print(f"{len(fit_set)} training rows, {len(held_set)} held out; hidden states in {time.perf_counter() - t0:.0f} s")
    lens = TunedLens(model.config.hidden_size, wanted, data.frequent_tokens(samples, vocab) if vocab else None)
    cfg = train.TrainConfig(epochs=epochs, lr=lr)
    fits = [train.fit_layer(model, lens, layer, fit_set, cfg, progress=console.print) for layer in wanted]
    heldout = train.evaluate(model, lens, held_set)
    coverage = data.coverage(lens.vocab, [s for s in samples if s.heldout])
    for row in heldout:
        console.print(f"layer {row['layer']}: held-out KL {row['logit_kl']:.2f} -> {row['tuned_kl']:.2f}; "
                      f"target's choice in top-10 {row['logit_top10']:.2f} -> {row['tuned_top10']:.2f}")  # fmt: skip
    report = {
        "command": "python -m shared.models.lens " + shlex.join(sys.argv[1:]),
        "date": date.today().isoformat(), "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "minutes": (time.time() - started) / 60, "target": smollm2.NAME, "layers": wanted,
        "train_rows": len(fit_set), "heldout_rows": len(held_set), "config": cfg.__dict__,
        "vocab": vocab, "heldout_vocab_coverage": coverage, "fit": fits, "heldout": heldout,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    lens.save(out, meta={"target": smollm2.NAME, "layers": wanted, "date": report["date"]})
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out}")


if __name__ == "__main__":
    app()
