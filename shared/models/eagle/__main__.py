"""Train the demo pair's EAGLE-3 head on this machine and write the committed files.

    python -m shared.models.eagle [--minutes 30] [--prompts N] [--steps 4] [--vocab 8192]

    distill corpus + self-instruct questions (bench prompts excluded)
      ──target greedy, features and top-8 choices captured in the same pass (data.py)──▶ answers, features, labels
      ──train.py (training-time test)──▶ head ──evaluate.py on held-out answers──▶ acceptance
      ──▶ shared/models/weights/smollm2-eagle3/{config.json, head.safetensors, report.json}

The committed file holds only what was trained (fc, the decoder layer, the
final norm) plus the draft vocabulary (d2t); ``tandem models prepare --pair
eagle`` adds the target's embedding and LM-head rows (smollm2_eagle.py).
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

from shared.models.eagle import data, evaluate, train

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights" / "smollm2-eagle3"
AUX_LAYERS = [2, 15, 30]  # low, middle, and the last layer's output (the target's own next-token state)
FROZEN = ("embed_tokens.weight", "lm_head.weight")  # the target's: rebuilt at prepare time, not committed

app = typer.Typer(add_completion=False)


def exclude_bench(prompts):
    """Drop every corpus prompt that appears in (or contains) a benchmark prompt."""
    from bench.prompts import BenchTexts  # grounded and chat bench prompts

    bench = BenchTexts()
    return [p for p in prompts if not bench.overlaps(p.text)]


def save_committed(head, out_dir: Path, report: dict) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.detach().cpu().contiguous() if k == "d2t" else v.detach().to("cpu", torch.float16).contiguous())
        for k, v in head.state_dict().items()
        if k not in FROZEN and not k.startswith("rotary_emb.")
    }
    save_file(state, str(out_dir / "head.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(head.cfg.to_json(), indent=2) + "\n")
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")


def load_trained(head, path: Path) -> None:
    """Start from a committed head's trained weights (``save_committed``'s file): continue a training run.

    The draft vocabulary must be the same (same data, same ``--vocab``); the target's embedding and
    LM-head rows already in ``head`` stay."""
    from safetensors.torch import load_file

    state = load_file(str(path))
    if not torch.equal(state["d2t"].long(), head.d2t.long()):
        raise ValueError(f"{path}: its draft vocabulary differs from this data's; train from scratch instead")
    own = head.state_dict()
    missing = [k for k in own if k not in state and k not in FROZEN and not k.startswith("rotary_emb.")]
    if missing:
        raise ValueError(f"{path}: no weights for {missing[:4]}")
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)


@app.command()
def main(
    minutes: float = typer.Option(30.0, help="Training time box."),
    prompts: int = typer.Option(0, help="Corpus prompts to use; 0 = all."),
    max_new_tokens: int = typer.Option(128, help="Longest target answer generated per prompt."),
    steps: int = typer.Option(4, help="Draft steps unrolled in training (training-time test)."),
    vocab: int = typer.Option(8192, help="Draft vocabulary size (most frequent target choices)."),
    lr: float = typer.Option(1e-3),
    batch_tokens: int = typer.Option(4096),
    prompt_weight: float = typer.Option(0.0, help="Loss weight of prompt positions (the head drafts after them)."),
    self_instruct: int = typer.Option(0, help="Add this many free-form questions written by the target itself "
                                      "(distill/self_instruct.py) to the corpus."),
    soft: float = typer.Option(0.5, help="Weight of soft labels (the target's top-8 distribution) against the argmax."),
    init: Path = typer.Option(None, help="Continue from this committed head file (head.safetensors) instead of a "
                              "fresh head: another time box on the same data."),
    bf16: bool = typer.Option(True, help="Train under bfloat16 autocast (faster on CPUs with AVX512-BF16)."),
    threads: int = typer.Option(2),
    home: Path = typer.Option(None, help="Tandem home (models, caches); default $TANDEM_HOME or ~/.cache/tandem."),
    out: Path = typer.Option(WEIGHTS_DIR, help="Where the committed files go."),
    evaluate_only: bool = typer.Option(False, help="Evaluate the --init head again (no training) and update the "
                                       "held-out figures in --out's report.json; the weights are not rewritten."),
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from shared.models import smollm2
    from shared.models.distill import corpus
    from shared.models.paths import Paths

    console = Console()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    paths = Paths.resolve(home)
    target_dir = smollm2.prepare(paths, console)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
    pool = corpus.build(prompts or None)
    if self_instruct:
        from shared.models.distill import self_instruct as si

        asked = si.questions(target, tokenizer, self_instruct, paths.home / "eagle-data", progress=console.print)
        pool += [corpus.Prompt("self", q, corpus.is_heldout(q)) for q in asked]
    pool = exclude_bench(pool)
    t0 = time.perf_counter()
    seqs = data.build(target, tokenizer, pool, paths.home / "eagle-data", AUX_LAYERS, max_new_tokens=max_new_tokens,
                      tag=smollm2.NAME)  # fmt: skip
    data_s = time.perf_counter() - t0
    train_seqs = [s for s in seqs if not s.heldout]
    held = [s for s in seqs if s.heldout]
    vocab_ids, covered = train.draft_vocab(train_seqs, vocab)
    console.print(f"{len(train_seqs)} training answers ({sum(len(s.ids) for s in train_seqs)} tokens), "
                  f"{len(held)} held out; draft vocab {len(vocab_ids)} covers {covered:.3f} of the target's choices")  # fmt: skip
    head = train.new_head(target, vocab_ids, AUX_LAYERS)
    if init is not None:
        load_trained(head, init)
        console.print(f"continuing from {init}")
    t2d = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    t2d[torch.tensor(vocab_ids)] = torch.arange(len(vocab_ids))
    if evaluate_only and init is None:
        raise typer.BadParameter("--evaluate-only needs --init (the head to evaluate)")
    cfg = train.TrainConfig(steps=steps, lr=lr, batch_tokens=batch_tokens, minutes=minutes, prompt_weight=prompt_weight, bf16=bf16, soft=soft)
    fit = None if evaluate_only else train.train(head, train_seqs, t2d, cfg, progress=console.print)
    heldout = {"all": evaluate.chain_acceptance(head, held, k=4)}
    for kind in sorted({s.kind for s in held}):
        heldout[kind] = evaluate.chain_acceptance(head, [s for s in held if s.kind == kind], k=4)
    console.print(f"held out, k = 4 chain: {heldout['all']}")
    # the benchmark's open-chat prompts: never trained on (exclude_bench), the figure the feature draft's goal is about
    from bench.prompts import CHAT

    chat = data.build(target, tokenizer, [corpus.Prompt("chat", t, True) for t in CHAT], paths.home / "eagle-data",
                      AUX_LAYERS, max_new_tokens=max_new_tokens, tag=smollm2.NAME + ":bench-chat")  # fmt: skip
    heldout["bench_chat"] = evaluate.chain_acceptance(head, chat, k=4)
    console.print(f"bench chat prompts (held out), k = 4 chain: {heldout['bench_chat']}")
    if evaluate_only:
        report = json.loads((out / "report.json").read_text())
        report["heldout_k4"] = heldout
        report["evaluated"] = {"command": "python -m shared.models.eagle " + shlex.join(sys.argv[1:]), "date": date.today().isoformat()}
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"[green]✓[/] updated {out / 'report.json'}")
        return
    report = {
        "command": "python -m shared.models.eagle " + shlex.join(sys.argv[1:]),
        "target": smollm2.NAME,
        "aux_layer_ids": AUX_LAYERS,
        "data": {
            "prompts": len(pool),
            "train_answers": len(train_seqs),
            "train_tokens": sum(len(s.ids) for s in train_seqs),
            "heldout_answers": len(held),
            "max_new_tokens": max_new_tokens,
            "data_seconds": round(data_s, 1),
            "draft_vocab": len(vocab_ids),
            "draft_vocab_coverage": round(covered, 4),
        },
        "train": {**fit, "init": str(init) if init else None, "steps_unrolled": steps, "lr": lr, "batch_tokens": batch_tokens, "prompt_weight": prompt_weight,
                  "soft": soft, "bf16": bf16, "log_tail": cfg.log[-5:]},
        "heldout_k4": heldout,
        "machine": {"platform": platform.platform(), "cpu_count": torch.get_num_threads(), "torch": torch.__version__},
        "date": date.today().isoformat(),
    }
    save_committed(head, out, report)
    console.print(f"[green]✓[/] wrote {out}")


if __name__ == "__main__":
    app()
