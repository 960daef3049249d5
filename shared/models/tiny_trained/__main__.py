"""Train the tiny trained pair: ``python -m shared.models.tiny_trained`` (once; the result is committed).

    1. corpus: stdlib files, split by path hash (corpus.py); byte-level BPE on the held-in files
    2. target: next-token prediction on random windows of the held-in token stream
    3. data: the target's greedy continuations of held-in snippets, with its top-k log-probs
    4. draft: distilled on them (distill/train.py: soft top-k + hard greedy-token loss)
    5. held-out files: snippets the target continues greedily; the draft's teacher-forced
       agreement and chain acceptance on them (distill/evaluate.py), after the fp16 round trip
    6. both models + tokenizer as HF directories under weights/tiny-trained/, and report.json
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console
from rich.table import Table

from shared.models.distill import evaluate
from shared.models.distill.generate import Sample
from shared.models.distill.train import TrainConfig, train as distill
from shared.models.tiny import tiny_config
from shared.models.tiny_trained import REPORT, WEIGHTS, corpus

CHAIN_KS = (1, 2, 3, 4, 5)
TOP_K = 16


def build_model(tokenizer, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, context: int, seed: int):
    from transformers import AutoModelForCausalLM

    config = tiny_config(
        "llama",
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        max_position_embeddings=context,
        intermediate_size=intermediate,
        tie_word_embeddings=True,  # the 4096 x hidden table is a quarter of the target: share it with the head
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up, cosine decay to 10 % of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_lm(model, stream: torch.Tensor, *, steps: int, batch_size: int, seq_len: int, lr: float, seed: int, console: Console) -> dict:
    """Next-token prediction on ``steps`` batches of random windows of ``stream`` (the held-in tokens, files joined by EOS)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    model.train()
    start, ema = time.perf_counter(), None
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=gen)
        batch = torch.stack([stream[s : s + seq_len + 1] for s in starts.tolist()])  # [B, T+1]
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=min(100, steps // 10 + 1))
        loss = _lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        if (step + 1) % 25 == 0 or step + 1 == steps:
            console.print(f"target step {step + 1}/{steps} loss {ema:.3f} {time.perf_counter() - start:.0f} s")
    model.eval()
    return {"steps": steps, "train_seconds": round(time.perf_counter() - start, 1), "train_tokens": steps * batch_size * seq_len, "final_train_loss": round(ema or 0.0, 4)}


def _lm_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=batch[:, :-1]).logits  # [B, T, V]
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


@torch.inference_mode()
def heldout_loss(model, streams: list[torch.Tensor], seq_len: int, eos_id: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping windows of the held-out files (joined by EOS)."""
    stream = torch.cat([torch.cat([s, torch.tensor([eos_id])]) for s in streams])
    num = (len(stream) - 1) // seq_len
    windows = stream[: num * seq_len + 1].unfold(0, seq_len + 1, seq_len)  # [num, T+1], overlapping by one token
    total = 0.0
    for b in range(0, num, batch_size):
        chunk = windows[b : b + batch_size]
        logits = model(input_ids=chunk[:, :-1]).logits  # [B, T, V]
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum"))
    return total / max(1, num * seq_len)


def snippets(streams: list[torch.Tensor], num: int, length: int, rng: random.Random) -> list[list[int]]:
    """``num`` windows of ``length`` tokens at random offsets, files picked in proportion to their length."""
    usable = [s for s in streams if len(s) > length]
    weights = [len(s) - length for s in usable]
    out = []
    for s in rng.choices(usable, weights=weights, k=num):
        i = rng.randrange(len(s) - length)
        out.append(s[i : i + length].tolist())
    return out


@torch.inference_mode()
def continuations(model, prompts: list[list[int]], new_tokens: int, eos_id: int, heldout: bool, batch_size: int = 64) -> list[Sample]:
    """The target's greedy continuation of every prompt (equal lengths: no padding), cut after EOS, with top-k log-probs."""
    samples = []
    for b in range(0, len(prompts), batch_size):
        batch = torch.tensor(prompts[b : b + batch_size])  # [B, L]
        out = model.generate(
            input_ids=batch, attention_mask=torch.ones_like(batch), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=eos_id, eos_token_id=None,
        )
        new_ids = out.sequences[:, batch.shape[1] :]  # [B, steps]
        logits = torch.stack(out.logits, dim=1).float()  # [B, steps, V]
        for i, prompt in enumerate(prompts[b : b + batch_size]):
            ids = new_ids[i].tolist()
            n = next((j + 1 for j, t in enumerate(ids) if t == eos_id), len(ids))
            top = logits[i, :n].log_softmax(-1).topk(TOP_K, dim=-1)
            samples.append(Sample(prompt, ids[:n], top.indices.to(torch.int32), top.values.to(torch.float16), heldout, "code"))
    return samples


def fp16_round_trip(model) -> None:
    """Evaluate what is committed: the weights as fp16, computed in fp32 (how the engine loads them on CPU)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def save(model, tokenizer, directory: Path) -> None:
    if directory.exists():
        for f in directory.iterdir():
            f.unlink()
    model.to(torch.float16).save_pretrained(directory)
    model.to(torch.float32)
    tokenizer.save_pretrained(directory)


def main(
    vocab_size: Annotated[int, typer.Option(help="BPE vocabulary (2 special tokens included).")] = 4096,
    target_steps: Annotated[int, typer.Option(help="Target optimiser steps.")] = 1500,
    batch_size: Annotated[int, typer.Option(help="Target windows per step.")] = 16,
    seq_len: Annotated[int, typer.Option(help="Target training window (tokens).")] = 256,
    target_lr: Annotated[float, typer.Option()] = 3e-3,
    prompts: Annotated[int, typer.Option(help="Held-in snippets the target continues for the draft.")] = 4096,
    heldout_prompts: Annotated[int, typer.Option(help="Held-out snippets for the evaluation.")] = 256,
    prompt_len: Annotated[int, typer.Option(help="Snippet length (tokens).")] = 64,
    new_tokens: Annotated[int, typer.Option(help="Greedy continuation length (tokens).")] = 64,
    draft_epochs: Annotated[int, typer.Option()] = 4,
    draft_lr: Annotated[float, typer.Option()] = 3e-3,
    draft_batch_tokens: Annotated[int, typer.Option(help="Labelled rows per draft step.")] = 2048,
    seed: Annotated[int, typer.Option()] = 0,
    threads: Annotated[int, typer.Option(help="torch threads (0: torch's default).")] = 0,
    target_from: Annotated[Path | None, typer.Option(help="Reuse this trained target directory (and its tokenizer): distil a new draft only.")] = None,
    out: Annotated[Path, typer.Option(help="Directory for target/, draft/ and report.json.")] = WEIGHTS,
) -> None:
    console = Console()
    if threads:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    files = corpus.load()
    held_in = [f for f in files if not f.heldout]
    held_out = [f for f in files if f.heldout]
    t = time.perf_counter()
    if target_from is None:
        tokenizer = corpus.train_tokenizer([f.text for f in held_in], vocab_size)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(target_from, local_files_only=True)
    tokenizer_s = time.perf_counter() - t
    eos = tokenizer.eos_token_id
    encode = tokenizer.backend_tokenizer.encode_batch
    in_streams = [torch.tensor(e.ids) for e in encode([f.text for f in held_in])]
    out_streams = [torch.tensor(e.ids) for e in encode([f.text for f in held_out])]
    stream = torch.cat([torch.cat([s, torch.tensor([eos])]) for s in in_streams])
    console.print(
        f"corpus: {len(held_in)} held-in files ({len(stream)} tokens), {len(held_out)} held-out "
        f"({sum(map(len, out_streams))} tokens); tokenizer {len(tokenizer)} in {tokenizer_s:.1f} s"
    )

    if target_from is None:
        target = build_model(tokenizer, hidden=256, layers=4, heads=4, kv_heads=2, intermediate=768, context=512, seed=seed)
        target_summary = train_lm(target, stream, steps=target_steps, batch_size=batch_size, seq_len=seq_len, lr=target_lr, seed=seed, console=console)
    else:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_from, dtype=torch.float32, local_files_only=True).eval()
        previous = json.loads((target_from.parent / REPORT.name).read_text()) if (target_from.parent / REPORT.name).is_file() else {}
        target_summary = {**previous.get("target", {}), "reused_from": str(target_from), "trained_by": previous.get("command")}
    target.requires_grad_(False)
    fp16_round_trip(target)
    target_summary["heldout_loss"] = round(heldout_loss(target, out_streams, seq_len, eos), 4)
    console.print(f"target: held-out loss {target_summary['heldout_loss']:.3f} nats/token")

    t = time.perf_counter()
    rng = random.Random(seed)
    train_set = continuations(target, snippets(in_streams, prompts, prompt_len, rng), new_tokens, eos, heldout=False)
    held = continuations(target, snippets(out_streams, heldout_prompts, prompt_len, rng), new_tokens, eos, heldout=True)
    generate_s = time.perf_counter() - t
    console.print(f"{len(train_set)} training / {len(held)} held-out continuations in {generate_s:.0f} s")

    draft = build_model(tokenizer, hidden=128, layers=2, heads=4, kv_heads=2, intermediate=384, context=512, seed=seed + 1)
    cfg = TrainConfig(epochs=draft_epochs, lr=draft_lr, batch_tokens=draft_batch_tokens, weight_decay=0.01, seed=seed)
    draft_summary = distill(draft, list(draft.parameters()), train_set, tokenizer.pad_token_id, cfg)
    draft.requires_grad_(False)
    fp16_round_trip(draft)
    draft_summary["heldout_loss"] = round(heldout_loss(draft, out_streams, seq_len, eos), 4)

    labels = [s.output_ids for s in held]  # the target's greedy continuation is the reference
    agree, per = evaluate.agreement(labels, evaluate.greedy_labels(draft, held))
    chains = {k: evaluate.chain_stats(per, k) for k in CHAIN_KS}
    sizes = {name: sum(p.numel() for p in m.parameters()) for name, m in (("target", target), ("draft", draft))}
    out.mkdir(parents=True, exist_ok=True)
    if target_from is None or (out / "target").resolve() != target_from.resolve():
        save(target, tokenizer, out / "target")
    save(draft, tokenizer, out / "draft")
    info = {
        "command": "python -m shared.models.tiny_trained " + " ".join(sys.argv[1:]),
        "corpus": {
            "source": "CPython stdlib *.py (shared/models/tiny_trained/corpus.py)", "python": platform.python_version(),
            "digest": corpus.digest(files), "heldin_files": len(held_in), "heldout_files": len(held_out),
            "heldin_tokens": len(stream), "heldout_tokens": sum(map(len, out_streams)),
        },
        "tokenizer": {"kind": "byte-level BPE (tokenizers)", "vocab_size": len(tokenizer), "special_tokens": corpus.SPECIAL_TOKENS, "train_seconds": round(tokenizer_s, 1)},
        "target": {"params": sizes["target"], "hidden": 256, "layers": 4, "heads": "4/2", "intermediate": 768, "tied_embeddings": True, "batch_size": batch_size, "seq_len": seq_len, "lr": target_lr, **target_summary},
        "draft": {"params": sizes["draft"], "hidden": 128, "layers": 2, "heads": "4/2", "intermediate": 384, "tied_embeddings": True, **draft_summary, "epochs": draft_epochs, "lr": draft_lr, "batch_tokens": draft_batch_tokens},
        "data": {"prompts": prompts, "prompt_len": prompt_len, "new_tokens": new_tokens, "top_k": TOP_K, "train_tokens": sum(len(s.output_ids) for s in train_set), "generate_seconds": round(generate_s, 1)},
        "heldout": {
            "prompts": len(held), "tokens": sum(map(len, labels)), "agreement": round(agree, 4),
            "chain": {str(k): {"acceptance_rate": round(c.acceptance_rate, 4), "tokens_per_step": round(c.tokens_per_step, 3)} for k, c in chains.items()},
        },
        "total_seconds": round(time.perf_counter() - started, 1),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads()},
        "date": time.strftime("%Y-%m-%d"),
    }
    report = out / REPORT.name
    report.write_text(json.dumps(info, indent=2) + "\n")

    table = Table(title=f"draft vs target on {len(held)} held-out snippets ({info['heldout']['tokens']} target tokens)")
    for col in ("agreement", *(f"k={k} acc / tok/step" for k in CHAIN_KS)):
        table.add_column(col)
    table.add_row(f"{agree:.3f}", *(f"{c.acceptance_rate:.3f} / {c.tokens_per_step:.2f}" for c in chains.values()))
    console.print(table)
    console.print(f"params target {sizes['target'] / 1e6:.2f} M, draft {sizes['draft'] / 1e6:.2f} M; wrote {out} in {info['total_seconds']:.0f} s")


if __name__ == "__main__":
    typer.run(main)
