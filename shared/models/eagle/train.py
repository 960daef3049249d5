"""Fit the head with training-time test on the target's own greedy answers (ttt.py, data.py).

The head learns the target's choice at every position, at each of ``steps``
unrolled draft steps; loss weights fall with the step (later drafts matter
less: they are only reached when the earlier ones were accepted). The token
embedding and the LM head are the target's own, frozen (the LM head keeps
only the draft vocabulary's rows), so the head learns to land in the
target's feature space, as EAGLE does, and only ~6M parameters train.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shared.engine.eagle.model import Eagle3Config, Eagle3Head
from shared.models.eagle.data import Sequence
from shared.models.eagle.ttt import unroll


@dataclass
class TrainConfig:
    steps: int = 4  # draft steps unrolled per batch (training-time test)
    step_decay: float = 0.8  # loss weight of step s: decay**s
    prompt_weight: float = 0.1  # loss weight of positions inside the prompt (the head drafts after it)
    lr: float = 1e-3
    warmup: int = 50
    batch_tokens: int = 4096
    minutes: float = 20.0  # time box; the schedule is planned for max_updates
    max_updates: int = 100_000
    epochs: float = 100.0
    seed: int = 0
    bf16: bool = False  # autocast the forward to bfloat16 (CPUs with AVX512-BF16 / AMX run it faster)
    soft: float = 0.0  # weight of the soft labels (the target's top-K distribution, EAGLE-3's target) vs argmax CE
    log: list = field(default_factory=list)


def draft_vocab(seqs: list[Sequence], size: int) -> tuple[list[int], float]:
    """The ``size`` most frequent target choices after the prompts, and the share of them covered."""
    counts: Counter[int] = Counter()
    for s in seqs:
        counts.update(s.labels[s.num_prompt - 1 :].tolist())
    ids = sorted(t for t, _ in counts.most_common(size))
    covered = sum(counts[t] for t in ids) / max(1, sum(counts.values()))
    return ids, covered


def new_head(target, vocab_ids: list[int], aux_layer_ids: list[int]) -> Eagle3Head:
    """A head shaped like one of the target's layers, with the target's embedding, final norm and LM-head rows."""
    tc = target.config
    cfg = Eagle3Config(
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", 0) or 0,
        vocab_size=tc.vocab_size,
        draft_vocab_size=len(vocab_ids),
        target_hidden_size=tc.hidden_size,
        aux_layer_ids=list(aux_layer_ids),
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=(getattr(tc, "rope_parameters", None) or {}).get("rope_theta", getattr(tc, "rope_theta", 10000.0)),
        max_position_embeddings=tc.max_position_embeddings,
    )
    head = Eagle3Head(cfg)
    std = tc.initializer_range
    for name, p in head.named_parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=std)
    ids = torch.tensor(vocab_ids)
    with torch.no_grad():
        emb = target.get_input_embeddings().weight
        head.embed_tokens.weight.copy_(emb)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[ids])
        head.norm.weight.copy_(target.model.norm.weight)
        head.d2t.copy_(ids - torch.arange(len(ids)))
        # start from "the feature is the previous token's last hidden state": fc picks the top layer's block
        h = tc.hidden_size
        top = aux_layer_ids.index(max(aux_layer_ids))
        head.fc.weight.mul_(0.1)
        head.fc.weight[:, top * h : (top + 1) * h] += torch.eye(h)
        head.midlayer.self_attn.o_proj.weight.mul_(0.1)
        head.midlayer.mlp.down_proj.weight.mul_(0.1)
    head.embed_tokens.requires_grad_(False)
    head.lm_head.requires_grad_(False)
    return head


def batches(seqs: list[Sequence], batch_tokens: int, rng: random.Random) -> list[list[Sequence]]:
    """Length-sorted buckets of about ``batch_tokens`` padded tokens, in random order."""
    order = sorted(seqs, key=lambda s: len(s.ids))
    out, cur = [], []
    for s in order:
        if cur and (len(cur) + 1) * len(s.ids) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(batch: list[Sequence], t2d: torch.Tensor, prompt_weight: float):
    """Padded ids [B, T], aux [B, T, W] (float32), draft-vocab labels [B, T] (-1: none), weights [B, T],
    soft labels: draft-vocab ids [B, T, K] (-1: none) and probabilities [B, T, K] renormalised over the draft
    vocabulary (all zero where a sequence has none)."""
    width = max(len(s.ids) for s in batch)
    b = len(batch)
    k = next((s.soft_ids.shape[1] for s in batch if s.soft_ids is not None), 1)
    ids = torch.zeros(b, width, dtype=torch.long)
    aux = torch.zeros(b, width, batch[0].aux.shape[1])
    labels = torch.full((b, width), -1, dtype=torch.long)
    weights = torch.zeros(b, width)
    soft_ids = torch.full((b, width, k), -1, dtype=torch.long)
    soft_p = torch.zeros(b, width, k)
    for r, s in enumerate(batch):
        n = len(s.ids)
        ids[r, :n] = s.ids
        aux[r, :n] = s.aux.float()
        labels[r, :n] = torch.where(s.labels >= 0, t2d[s.labels.clamp(min=0)], -1)
        weights[r, :n] = prompt_weight
        weights[r, s.num_prompt - 1 : n] = 1.0
        if s.soft_ids is not None:
            mapped = t2d[s.soft_ids.long()]  # [n, K]
            p = s.soft_logp.float().exp() * (mapped >= 0) * (s.labels >= 0)[:, None]
            soft_ids[r, :n] = mapped
            soft_p[r, :n] = p / p.sum(-1, keepdim=True).clamp(min=1e-6)
    return ids, aux, labels, weights, soft_ids, soft_p


def _shift(x: torch.Tensor, s: int, fill) -> torch.Tensor:
    """x[:, p + s] at p (``fill`` past the end): what step s predicts at position p."""
    return torch.cat([x[:, s:], x.new_full((x.shape[0], s, *x.shape[2:]), fill)], dim=1)


def step_loss(head: Eagle3Head, ids, aux, labels, weights, soft_ids=None, soft_p=None,
              cfg: TrainConfig | None = None) -> tuple[torch.Tensor, list[float]]:
    """Weighted loss over the unrolled steps, (1 - soft)·CE(argmax) + soft·CE(the target's top-K distribution);
    also each step's top-1 agreement with the target."""
    cfg = cfg or TrainConfig()
    outs = unroll(head, ids, aux, cfg.steps)
    total = torch.zeros(())
    accs = []
    use_soft = cfg.soft > 0 and soft_p is not None and bool(soft_p.any())
    for s, out in enumerate(outs):
        lab = _shift(labels, s, -1)  # the target's choice at p+s
        w = _shift(weights, s, 0.0)
        keep = (lab >= 0) & (w > 0)
        logits = head.logits(out[keep]).float()  # [N, draft_vocab]
        loss = F.cross_entropy(logits, lab[keep], reduction="none")  # [N]
        if use_soft:
            sid, sp = _shift(soft_ids, s, -1)[keep], _shift(soft_p, s, 0.0)[keep]  # [N, K]
            logq = logits.log_softmax(-1).gather(1, sid.clamp(min=0))  # [N, K]
            loss = (1 - cfg.soft) * loss - cfg.soft * (sp * logq).sum(-1)
        total = total + cfg.step_decay**s * (loss * w[keep]).sum() / w[keep].sum().clamp(min=1)
        accs.append(float((logits.argmax(-1) == lab[keep]).float().mean()) if keep.any() else 0.0)
    return total, accs


def train(head: Eagle3Head, seqs: list[Sequence], t2d: torch.Tensor, cfg: TrainConfig, progress=print) -> dict:
    rng = random.Random(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    head.train()
    start = time.perf_counter()
    deadline = start + 60 * cfg.minutes
    update = 0
    epoch = 0.0
    tokens = 0
    plan = batches(seqs, cfg.batch_tokens, rng)
    per_epoch = len(plan)
    planned = min(cfg.max_updates, int(cfg.epochs * per_epoch))
    ema = None
    while update < planned and time.perf_counter() < deadline:
        if not plan:
            plan = batches(seqs, cfg.batch_tokens, rng)
        batch = plan.pop()
        ids, aux, labels, weights, soft_ids, soft_p = collate(batch, t2d, cfg.prompt_weight)
        # linear warmup, then cosine to 10 % over the time box (estimated from the pace so far)
        elapsed = time.perf_counter() - start
        frac = min(1.0, elapsed / (60 * cfg.minutes))
        lr = cfg.lr * min(1.0, (update + 1) / cfg.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, accs = step_loss(head, ids, aux, labels, weights, soft_ids, soft_p, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        update += 1
        tokens += int((labels >= 0).sum())
        epoch = update / per_epoch
        ema = accs if ema is None else [0.95 * e + 0.05 * a for e, a in zip(ema, accs)]
        if update % 20 == 0:
            msg = (f"update {update} epoch {epoch:.2f} loss {float(loss):.3f} agree/step "
                   f"{' '.join(f'{a:.3f}' for a in ema)} lr {lr:.2e} {time.perf_counter() - start:.0f}s")  # fmt: skip
            cfg.log.append(msg)
            progress(msg)
    head.eval()
    return {
        "updates": update,
        "epochs": round(epoch, 2),
        "train_seconds": round(time.perf_counter() - start, 1),
        "train_tokens": tokens,
        "final_agreement_per_step": [round(a, 4) for a in (ema or [])],
    }
