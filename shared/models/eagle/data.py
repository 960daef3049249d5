"""The head's training data: the target's greedy answers, its features and its next-token choices.

    corpus prompts (distill corpus, bench prompts excluded)
      ──target, greedy, batched (distill.generate, cached)──▶ prompt_ids + output_ids
      ──one teacher-forced target forward per batch, hooks at the aux layers──▶
            aux   [T, 3·H] fp16   hidden states entering layers (2, 15) and the last layer's output (30)
            label [T]      int32  the target's argmax at each position (what the head must predict there)

Cached under ``<home>/eagle-data/`` (generations in shards by the distill
pipeline, features per shard), so a rerun or a longer training reuses them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.models.distill import generate
from shared.models.distill.corpus import Prompt


@dataclass
class Sequence:
    ids: torch.Tensor  # [T] int64: prompt + greedy output
    aux: torch.Tensor  # [T, width] fp16: target features of each position
    labels: torch.Tensor  # [T] int64: the target's argmax at each position
    num_prompt: int
    heldout: bool
    kind: str


def capture_hooks(model, layer_ids: list[int]):
    """Pre-hooks recording the hidden state entering each layer id (id N: the final norm's input)."""
    decoder = model.model
    num_layers = len(decoder.layers)
    store: dict[int, torch.Tensor] = {}
    handles = []
    for i in layer_ids:
        module = decoder.norm if i == num_layers else decoder.layers[i]

        def hook(mod, args, kwargs, i=i):
            store[i] = args[0] if args else kwargs["hidden_states"]

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return store, handles


@torch.inference_mode()
def featurize(model, samples: list[generate.Sample], layer_ids: list[int], batch_size: int = 8) -> list[Sequence]:
    """One teacher-forced forward per batch (right-padded: causal attention leaves the real rows unchanged)."""
    store, handles = capture_hooks(model, layer_ids)
    out: list[Sequence] = []
    try:
        order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].output_ids))
        done: dict[int, Sequence] = {}
        for b in range(0, len(order), batch_size):
            idx = order[b : b + batch_size]
            seqs = [samples[i].prompt_ids + samples[i].output_ids for i in idx]
            width = max(map(len, seqs))
            ids = torch.zeros(len(seqs), width, dtype=torch.long)
            mask = torch.zeros(len(seqs), width, dtype=torch.long)
            for r, s in enumerate(seqs):
                ids[r, : len(s)] = torch.tensor(s)
                mask[r, : len(s)] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits  # [B, T, vocab]
            labels = logits.argmax(-1)  # [B, T]
            aux = torch.cat([store[i] for i in layer_ids], dim=-1)  # [B, T, width]
            for r, (i, s) in enumerate(zip(idx, seqs)):
                n = len(s)
                smp = samples[i]
                done[i] = Sequence(
                    ids[r, :n].clone(), aux[r, :n].to(torch.float16).clone(), labels[r, :n].clone(),
                    len(smp.prompt_ids), smp.heldout, smp.kind,
                )  # fmt: skip
        out = [done[i] for i in range(len(samples))]
    finally:
        for h in handles:
            h.remove()
    return out


def build(
    model,
    tokenizer,
    prompts: list[Prompt],
    cache_dir: Path,
    layer_ids: list[int],
    *,
    max_new_tokens: int = 128,
    tag: str = "",
) -> list[Sequence]:
    """Generations (cached by the distill pipeline) plus their features (cached here), in prompt order."""
    samples = generate.generate(model, tokenizer, prompts, cache_dir / "generations", max_new_tokens=max_new_tokens, tag=tag)
    key = hashlib.sha1(
        json.dumps([tag, layer_ids, max_new_tokens, [p.text for p in prompts]]).encode()
    ).hexdigest()[:16]
    path = cache_dir / f"features-{key}.pt"
    if path.is_file():
        return torch.load(path, weights_only=False)
    seqs = featurize(model, samples, layer_ids)
    tmp = path.with_suffix(".partial")
    torch.save(seqs, tmp)
    tmp.replace(path)
    return seqs
