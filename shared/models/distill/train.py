"""Distil the draft on the target's own greedy continuations.

Each training sequence is ``prompt_ids + output_ids``; the loss sits on the
rows that predict output tokens only (the prompt is context, never a label)::

    rows:    p0 p1 ... p(m-1) | o0 o1 ... o(n-2)        (o(n-1) is never fed)
    labels:   -  -  ...  o0   | o1 o2 ... o(n-1)

    loss = (1 - hard_weight) * CE(target top-k distribution, draft)    soft labels: the target's ranking
         +      hard_weight  * CE(target greedy token, draft)           what greedy acceptance needs

The LM head (49152 x 576) dominates the cost, so it runs on the labelled rows
only. Sequences are packed into batches of about ``batch_tokens`` labelled
rows, right-padded: with causal attention, padding after a sequence changes
nothing before it.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from shared.models.distill.generate import Sample


@dataclass
class TrainConfig:
    epochs: int = 3
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    batch_tokens: int = 2048  # labelled rows per optimiser step
    hard_weight: float = 0.5
    seed: int = 0
    max_seq_len: int = 512


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] right-padded
    rows: torch.Tensor  # [N] flat indices into B*T of the labelled rows
    labels: torch.Tensor  # [N] target greedy tokens
    topk_ids: torch.Tensor  # [N, K]
    topk_logprobs: torch.Tensor  # [N, K]


def make_batch(samples: list[Sample], pad_id: int, max_seq_len: int) -> Batch:
    seqs, rows, labels, topk_ids, topk_lp = [], [], [], [], []
    width = min(max_seq_len, max(len(s.prompt_ids) + len(s.output_ids) - 1 for s in samples))
    for b, s in enumerate(samples):
        ids = (s.prompt_ids + s.output_ids[:-1])[:width]
        m = len(s.prompt_ids)
        n = min(len(s.output_ids), width - m + 1)  # labelled rows that fit
        seqs.append(ids + [pad_id] * (width - len(ids)))
        rows.append(torch.arange(m - 1, m - 1 + n) + b * width)
        labels.append(torch.tensor(s.output_ids[:n]))
        topk_ids.append(s.topk_ids[:n].long())
        topk_lp.append(s.topk_logprobs[:n].float())
    return Batch(torch.tensor(seqs), torch.cat(rows), torch.cat(labels), torch.cat(topk_ids), torch.cat(topk_lp))


def plan_batches(samples: list[Sample], batch_tokens: int, rng: random.Random) -> list[list[Sample]]:
    """Shuffle, then group by length (less padding) into batches of about ``batch_tokens`` labels; shuffle the batches."""
    order = samples[:]
    rng.shuffle(order)
    order.sort(key=lambda s: len(s.prompt_ids) + len(s.output_ids))
    batches, current, count = [], [], 0
    for s in order:
        current.append(s)
        count += len(s.output_ids)
        if count >= batch_tokens:
            batches.append(current)
            current, count = [], 0
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


class SubsetHead:
    """The served draft's head during training: logits over the vocabulary subset only (engine/vocab_subset.py).

    Training against the head the draft will be served with is both honest (the
    loss sees the renormalised subset distribution) and ~6x cheaper: the
    49152-row head is most of a step's work. Target tokens outside the subset
    cannot be drafted; their rows drop out of the hard loss and their share of
    the soft labels is renormalised away.
    """

    def __init__(self, lm_head_weight: torch.Tensor, ids: list[int]):
        self.ids = torch.tensor(ids)
        self.weight = lm_head_weight.detach()[self.ids]  # [S, H] frozen (tied to the input embedding)
        self.remap = torch.full((lm_head_weight.shape[0],), -1, dtype=torch.long)
        self.remap[self.ids] = torch.arange(len(ids))


def distill_loss(draft, batch: Batch, hard_weight: float, head: SubsetHead | None = None) -> tuple[torch.Tensor, float]:
    """(loss, share of labelled rows where the draft's argmax is the target's token)."""
    hidden = draft.model(input_ids=batch.input_ids).last_hidden_state  # [B, T, H]
    hidden = hidden.flatten(0, 1)[batch.rows]  # [N, H]
    if head is None:
        logq = draft.lm_head(hidden).float().log_softmax(-1)  # [N, V]
        topk_ids, labels = batch.topk_ids, batch.labels
    else:
        logq = (hidden @ head.weight.T).float().log_softmax(-1)  # [N, S]
        topk_ids, labels = head.remap[batch.topk_ids], head.remap[batch.labels]  # -1: outside the subset
    inside = topk_ids >= 0
    p = batch.topk_logprobs.masked_fill(~inside, float("-inf")).softmax(-1).nan_to_num(0.0)  # [N, K] renormalised
    soft = -(p * logq.gather(1, topk_ids.clamp(min=0))).sum(-1).mean()
    labelled = labels >= 0
    hard = -logq[labelled].gather(1, labels[labelled][:, None]).mean()
    agree = float((logq.argmax(-1) == labels).float().mean())
    return (1 - hard_weight) * soft + hard_weight * hard, agree


def train(
    draft, params: list[torch.nn.Parameter], samples: list[Sample], pad_id: int, cfg: TrainConfig, head: SubsetHead | None = None
) -> dict:
    """Train ``params`` of ``draft`` in place; returns a summary (steps, time, final training agreement)."""
    rng = random.Random(cfg.seed)
    torch.manual_seed(cfg.seed)
    plans = [plan_batches(samples, cfg.batch_tokens, rng) for _ in range(cfg.epochs)]
    total_steps = sum(map(len, plans))
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    def lr_at(step: int) -> float:  # linear warm-up, cosine decay to 10%
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    draft.train()
    start = time.perf_counter()
    step, ema_loss, ema_agree = 0, None, None
    columns = [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn()]
    with Progress(*columns) as progress:
        task = progress.add_task("distilling", total=total_steps)
        for epoch, plan in enumerate(plans):
            for group in plan:
                for g in opt.param_groups:
                    g["lr"] = lr_at(step)
                loss, agree = distill_loss(draft, make_batch(group, pad_id, cfg.max_seq_len), cfg.hard_weight, head)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                opt.step()
                step += 1
                value = float(loss.detach())
                ema_loss = value if ema_loss is None else 0.95 * ema_loss + 0.05 * value
                ema_agree = agree if ema_agree is None else 0.95 * ema_agree + 0.05 * agree
                description = f"epoch {epoch + 1} loss {ema_loss:.3f} agree {ema_agree:.3f}"
                progress.update(task, advance=1, description=description)
                if not progress.console.is_terminal and step % 25 == 0:  # logs get a line now and then
                    progress.console.print(f"step {step}/{total_steps} {description} {time.perf_counter() - start:.0f} s")
    draft.eval()
    return {
        "steps": step,
        "train_seconds": round(time.perf_counter() - start, 1),
        "train_tokens": sum(len(s.output_ids) for s in samples),
        "final_train_loss": round(ema_loss or 0.0, 4),
        "final_train_agreement": round(ema_agree or 0.0, 4),
    }
