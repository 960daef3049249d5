"""Fit one translator per layer: minimise KL(target's last-layer distribution || lens distribution).

    for each layer l:  A_l, b_l = argmin  E_rows KL( softmax(lm_head(f)) || softmax(lm_head(norm(h_l + A_l h_l + b_l))) )

The LM head and the final norm are the target's, frozen; only A_l and b_l
train (zero-initialised, so training starts at the logit lens). Adam over
shuffled row batches; the LM head runs in bfloat16 under autocast on CPU (the
vocabulary's 49k columns are nearly all of the cost), the loss in float32.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from shared.engine.tuned_lens import TunedLens
from shared.models.lens.data import LensData


@dataclass
class TrainConfig:
    epochs: float = 1.0
    batch_rows: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-3
    bf16: bool = True


def _lens_logp(model, lens: TunedLens, layer: int, hidden: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model.lm_head(model.model.norm(lens(layer, hidden)))
    return logits.float().log_softmax(-1)


@torch.no_grad()
def _target_logp(model, final: torch.Tensor, bf16: bool) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return model.lm_head(final.float()).float().log_softmax(-1)


def fit_layer(model, lens: TunedLens, layer: int, data: LensData, cfg: TrainConfig,
              progress: Callable[[str], None] = print) -> dict:
    """Train ``lens``'s translator of ``layer`` in place; returns its loss before and after (nats per row)."""
    lin = lens.translator[str(layer)]
    opt = torch.optim.AdamW(lin.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    n = len(data)
    steps = max(1, math.ceil(cfg.epochs * n / cfg.batch_rows))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(layer)
    perm = torch.randperm(n, generator=gen)
    t0 = time.perf_counter()
    losses = []
    for step in range(steps):
        start = (step * cfg.batch_rows) % n
        idx = perm[start : start + cfg.batch_rows]
        hidden = data.inner[layer][idx].float()
        target = _target_logp(model, data.final[idx], cfg.bf16)
        logp = _lens_logp(model, lens, layer, hidden, cfg.bf16)
        loss = (target.exp() * (target - logp)).sum(-1).mean()  # KL(p || q), nats per row
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    tail = losses[-max(1, steps // 10) :]
    out = {"layer": layer, "steps": steps, "first_loss": losses[0], "last_loss": sum(tail) / len(tail),
           "seconds": time.perf_counter() - t0}  # fmt: skip
    progress(f"layer {layer}: KL {out['first_loss']:.3f} -> {out['last_loss']:.3f} nats ({steps} steps, {out['seconds']:.0f} s)")
    return out


@torch.no_grad()
def evaluate(model, lens: TunedLens, data: LensData, ks: tuple[int, ...] = (1, 10), batch_rows: int = 512,
             bf16: bool = True) -> list[dict]:
    """Per layer, with and without the lens: KL to the last layer, and how often the target's argmax is in the top-K."""
    rows = []
    for layer in lens.layers:
        acc = {"layer": layer, "rows": len(data)}
        for name, use in (("logit", False), ("tuned", True)):
            kl = 0.0
            hits = {k: 0 for k in ks}
            for b in range(0, len(data), batch_rows):
                target = _target_logp(model, data.final[b : b + batch_rows], bf16)
                hidden = data.inner[layer][b : b + batch_rows].float()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    h = lens(layer, hidden) if use else hidden
                    logp = model.lm_head(model.model.norm(h)).float().log_softmax(-1)
                kl += (target.exp() * (target - logp)).sum().item()
                best = target.argmax(-1, keepdim=True)
                rank = (logp > logp.gather(1, best)).sum(-1)  # tokens scoring above the target's choice
                for k in ks:
                    hits[k] += int((rank < k).sum())
            acc[f"{name}_kl"] = kl / max(1, len(data))
            for k in ks:
                acc[f"{name}_top{k}"] = hits[k] / max(1, len(data))
        rows.append(acc)
    return rows
