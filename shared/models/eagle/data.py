"""The head's training data: the target's greedy answers, its features and its next-token choices.

    corpus prompts (distill corpus + self-instruct, bench prompts excluded)
      ──target, greedy, batched, hooks at the aux layers and on the LM head (one pass)──▶
            ids   [T]      prompt + the answer tokens the target ran (its last token never runs)
            aux   [T, 3·H] fp16   hidden states entering layers (2, 15) and the last layer's output (30)
            label [T]      int64  the target's argmax at each position (-1 inside the prompt: not computed)
            soft  [T, K]   the target's top-K log-probabilities there (K = SOFT_K), for soft labels

Generating and featurizing are one pass (``generate_features``): the forward
hooks record every forward of ``generate`` (the prefill, then one row per
decode step), so no teacher-forced forward runs again over the answers, which
on a 2-core CPU costs as much as generating them. ``featurize`` is the
teacher-forced variant for answers that already exist.

Cached under ``<home>/eagle-data/`` in shards of ``generate.SHARD_SIZE`` prompts, each
named by what produced it, so an interrupted run resumes and a longer
training reuses them.
"""

from __future__ import annotations

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
    soft_ids: torch.Tensor | None = None  # [T, SOFT_K] int32: the target's top-K choices at each position
    soft_logp: torch.Tensor | None = None  # [T, SOFT_K] fp16: their log-probabilities (rows with label -1: unset)


SOFT_K = 8
BATCH_SIZE = 32


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
            ids, mask = generate.right_padded(seqs)
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


@torch.inference_mode()
def generate_features(
    model, tokenizer, prompts: list[Prompt], layer_ids: list[int], *, max_new_tokens: int = 128, soft_k: int = SOFT_K
) -> list[Sequence]:
    """Greedy answers for one batch (left-padded) with the features and the target's choices captured on the way."""
    encoded = [generate.encode(tokenizer, p) for p in prompts]
    width = max(map(len, encoded))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # [B, width]
    attention_mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])  # [B, width]
    store, handles = capture_hooks(model, layer_ids)
    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # per forward: aux, top ids, top log-probs

    def on_logits(mod, args, out):  # the LM head of every forward: prefill (last row only), then each decode step
        top = out[:, -1].float().log_softmax(-1).topk(soft_k, dim=-1)  # [B, K]
        aux = torch.cat([store[i] for i in layer_ids], dim=-1).to(torch.float16)  # [B, t, W]
        calls.append((aux, top.indices.to(torch.int32), top.values.to(torch.float16)))

    handles.append(model.lm_head.register_forward_hook(on_logits))
    try:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad)  # fmt: skip
    finally:
        for h in handles:
            h.remove()
    new_ids = out[:, width:]  # [B, steps]
    eos = set(generate._as_list(model.generation_config.eos_token_id))
    seqs = []
    for r, (p, e) in enumerate(zip(prompts, encoded)):
        row = new_ids[r].tolist()
        n_out = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        # the target ran the prompt and the first n_out - 1 answer tokens; the last one never ran
        ran = n_out - 1
        aux = torch.cat([calls[0][0][r, width - len(e) :]] + [calls[j][0][r] for j in range(1, ran + 1)])  # [T, W]
        num_prompt, t = len(e), len(e) + ran
        labels = torch.full((t,), -1, dtype=torch.long)
        labels[num_prompt - 1 :] = torch.tensor(row[:n_out])  # greedy: the answer token after each is the argmax
        soft_ids = torch.zeros(t, soft_k, dtype=torch.int32)
        soft_logp = torch.zeros(t, soft_k, dtype=torch.float16)
        soft_ids[num_prompt - 1 :] = torch.stack([calls[j][1][r] for j in range(n_out)])
        soft_logp[num_prompt - 1 :] = torch.stack([calls[j][2][r] for j in range(n_out)])
        ids = torch.tensor(e + row[:ran], dtype=torch.long)
        seqs.append(Sequence(ids, aux.clone(), labels, num_prompt, p.heldout, p.kind, soft_ids, soft_logp))
    return seqs


def build(
    model,
    tokenizer,
    prompts: list[Prompt],
    cache_dir: Path,
    layer_ids: list[int],
    *,
    max_new_tokens: int = 128,
    tag: str = "",
    batch_size: int = BATCH_SIZE,
) -> list[Sequence]:
    """Answers with their features and the target's choices (``generate_features``), in prompt order, cached per shard."""
    return generate.cached_batches(
        prompts, cache_dir,
        lambda batch: generate_features(model, tokenizer, batch, layer_ids, max_new_tokens=max_new_tokens),
        prefix="answers", key=[tag, layer_ids, max_new_tokens, SOFT_K], batch_size=batch_size,
        label="target answers + features", count_tokens=lambda q: len(q.ids) - q.num_prompt,
    )  # fmt: skip
