"""Make the demo draft: ``python -m shared.models.distill`` (once; the result is committed).

    target greedy continuations of the corpus (cached under <home>/distill)   generate.py
    draft = target layers [0, 1, 29] + LoRA, trained on them                 draft.py, train.py
    vocabulary subset: the S most frequent tokens of the training data       engine/vocab_subset.py
    held-out evaluation: agreement, chain acceptance, decode cost            evaluate.py
    ──▶ shared/models/weights/smollm2-draft.safetensors   (adapters + norms + subset, fp16, a few MB)
    ──▶ shared/models/weights/smollm2-draft.json          (the command, settings and figures)

``tandem models prepare --pair demo`` then rebuilds the full draft from the
prepared target plus that file in seconds (``registry``), with no training.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.table import Table

from shared.engine import vocab_subset
from shared.models import smollm2
from shared.models.distill import corpus, draft as draft_lib, evaluate, generate
from shared.models.distill.train import SubsetHead, TrainConfig, train
from shared.models.paths import Paths

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
ADAPTER = WEIGHTS_DIR / "smollm2-draft.safetensors"
REPORT = WEIGHTS_DIR / "smollm2-draft.json"
CHAIN_KS = (1, 2, 3, 4, 5, 6, 8)


def frequent_tokens(samples: list[generate.Sample], size: int, always: list[int]) -> list[int]:
    """The ``size`` most frequent tokens of the training outputs (prompts count too: drafts copy from them)."""
    counts: Counter[int] = Counter()
    for s in samples:
        counts.update(s.output_ids)
        counts.update(s.prompt_ids)
    ranked = list(dict.fromkeys([*always, *(t for t, _ in counts.most_common())]))
    return sorted(ranked[:size])


@torch.inference_mode()
def subset_labels(model, samples: list[generate.Sample], ids: list[int] | None) -> list[list[int]]:
    """Teacher-forced draft argmax per output position, restricted to ``ids`` when given (as the served head is)."""
    keep = torch.tensor(ids) if ids is not None else None
    out = []
    for s in samples:
        seq = s.prompt_ids + s.output_ids[:-1]
        logits = model(input_ids=torch.tensor([seq])).logits[0, len(s.prompt_ids) - 1 :]  # [n, V]
        if keep is not None:
            logits = logits[:, keep].argmax(-1)
            out.append(keep[logits].tolist())
        else:
            out.append(logits.argmax(-1).tolist())
    return out


def evaluate_draft(target, draft, held: list[generate.Sample], ids: list[int], console: Console) -> dict:
    labels = [s.output_ids for s in held]  # the target's greedy continuation is the reference
    result: dict = {"heldout_prompts": len(held), "heldout_tokens": sum(map(len, labels))}
    for name, subset in (("full_vocab", None), ("subset", ids)):
        agree, per = evaluate.agreement(labels, subset_labels(draft, held, subset))
        chains = {k: evaluate.chain_stats(per, k) for k in CHAIN_KS}
        result[name] = {
            "agreement": round(agree, 4),
            "chain": {str(k): {"acceptance_rate": round(c.acceptance_rate, 4), "tokens_per_step": round(c.tokens_per_step, 3)} for k, c in chains.items()},
        }
    covered = sum(t in set(ids) for lab in labels for t in lab)
    result["subset_coverage"] = round(covered / max(1, result["heldout_tokens"]), 4)
    console.print("measuring batch-1 decode cost through the engine (target, draft full head, draft subset head) ...")
    t_target = evaluate.decode_step_seconds(target)
    t_full = evaluate.decode_step_seconds(draft)
    vocab_subset.install(draft, ids)
    t_subset = evaluate.decode_step_seconds(draft)
    result["decode_ms"] = {"target": round(t_target * 1e3, 2), "draft_full_head": round(t_full * 1e3, 2), "draft_subset_head": round(t_subset * 1e3, 2)}
    result["cost_ratio"] = round(t_subset / t_target, 4)
    return result


def main(
    prompts: Annotated[int, typer.Option(help="Corpus prompts (about 8 % are held out).")] = 1024,
    max_new_tokens: Annotated[int, typer.Option(help="Target continuation length per prompt.")] = 128,
    epochs: Annotated[int, typer.Option()] = 3,
    lr: Annotated[float, typer.Option()] = 1e-3,
    batch_tokens: Annotated[int, typer.Option(help="Labelled rows per optimiser step.")] = 2048,
    layers: Annotated[str, typer.Option(help="Target layers the draft starts from.")] = "0,1,29",
    rank: Annotated[int, typer.Option(help="LoRA rank.")] = 64,
    subset_size: Annotated[int, typer.Option(help="Draft vocabulary subset size (0: full vocabulary).")] = 8192,
    threads: Annotated[int, typer.Option(help="torch threads (0: torch's default).")] = 0,
    out: Annotated[Path, typer.Option(help="Adapter file to write.")] = ADAPTER,
) -> None:
    console = Console()
    if threads:
        torch.set_num_threads(threads)
    paths = Paths.resolve()
    target_dir = smollm2.prepare(paths, console)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    started = time.perf_counter()

    all_prompts = corpus.build(prompts)
    samples = generate.generate(
        target, tokenizer, all_prompts, paths.home / "distill" / smollm2.NAME,
        max_new_tokens=max_new_tokens, batch_size=32, tag=smollm2.NAME,
    )
    train_set = [s for s in samples if not s.heldout]
    held = [s for s in samples if s.heldout]
    generated_s = time.perf_counter() - started
    console.print(f"{len(train_set)} training / {len(held)} held-out samples, {sum(len(s.output_ids) for s in train_set)} training tokens")

    spec = draft_lib.DraftSpec(layer_ids=[int(x) for x in layers.split(",")], lora_rank=rank, lora_alpha=float(rank))
    draft = draft_lib.copy_layers(target, spec.layer_ids)
    params = draft_lib.add_adapters(draft, spec)
    special = sorted(set(tokenizer.all_special_ids))
    ids = frequent_tokens(train_set, subset_size, special) if subset_size else list(range(target.config.vocab_size))
    head = SubsetHead(draft.lm_head.weight, ids) if subset_size else None
    cfg = TrainConfig(epochs=epochs, lr=lr, batch_tokens=batch_tokens)
    summary = train(draft, params, train_set, tokenizer.pad_token_id, cfg, head)
    fingerprint = draft_lib.target_fingerprint(target)
    info = {
        "command": "python -m shared.models.distill " + " ".join(sys.argv[1:]),
        "target": smollm2.NAME,
        "spec": {"layer_ids": spec.layer_ids, "lora_rank": spec.lora_rank},
        "data": {"prompts": prompts, "max_new_tokens": max_new_tokens, "train_samples": len(train_set), "generate_seconds": round(generated_s, 1)},
        "train": {**summary, "epochs": epochs, "lr": lr, "batch_tokens": batch_tokens},
        "subset_size": len(ids),
        "machine": {"platform": platform.platform(), "cpu_count": __import__("os").cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d"),
    }
    draft_lib.save_adapter(out, draft, spec, fingerprint, info, vocab_ids=ids)

    draft_lib.merge_adapters(draft)
    info["heldout"] = evaluate_draft(target, draft, held, ids, console)
    out.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n")

    h = info["heldout"]
    table = Table(title=f"draft on {h['heldout_prompts']} held-out prompts ({h['heldout_tokens']} target tokens)")
    for col in ("head", "agreement", *(f"k={k} acc / tok/step" for k in (1, 3, 5))):
        table.add_column(col)
    for name in ("full_vocab", "subset"):
        r = h[name]
        table.add_row(name, f"{r['agreement']:.3f}", *(f"{r['chain'][str(k)]['acceptance_rate']:.3f} / {r['chain'][str(k)]['tokens_per_step']:.2f}" for k in (1, 3, 5)))
    console.print(table)
    console.print(f"subset coverage {h['subset_coverage']:.3f}; decode ms {h['decode_ms']}; draft/target cost {h['cost_ratio']:.3f}")
    console.print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB) and {out.with_suffix('.json')}")


if __name__ == "__main__":
    typer.run(main)
