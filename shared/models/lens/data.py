"""The lens's training data: hidden states after the checked layers and the last layer's state, at answer positions.

    corpus prompts (bench prompts excluded) ──target greedy (distill.generate, cached)──▶ answers
      ──one teacher-forced forward per batch, output_hidden_states──▶
            inner  {layer: [N, H]}  hidden state after decoder layer ``layer`` (0-based)
            final  [N, H]           the final norm's output: lm_head(final) are the target's logits

N counts the positions whose next token the target chose during the answer (the
prompt's last position through the answer's last but one): the rows a verify's
parent nodes occupy.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from shared.models.distill import generate


@dataclass
class LensData:
    inner: dict[int, torch.Tensor]  # layer -> [N, H] bf16
    final: torch.Tensor  # [N, H] bf16

    def __len__(self) -> int:
        return self.final.shape[0]


@torch.inference_mode()
def hidden_states(model, samples: list[generate.Sample], layers: list[int], batch_size: int = 8) -> LensData:
    """Teacher-forced forwards (right-padded) keeping the answer rows of each wanted layer."""
    inner: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    final: list[torch.Tensor] = []
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].output_ids))
    for b in range(0, len(order), batch_size):
        batch = [samples[i] for i in order[b : b + batch_size]]
        seqs = [s.prompt_ids + s.output_ids for s in batch]
        ids, mask = generate.right_padded(seqs)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        states = out.hidden_states  # [embeddings, after layer 0, ..., after the final norm]
        for r, s in enumerate(batch):
            rows = slice(len(s.prompt_ids) - 1, len(s.prompt_ids) + len(s.output_ids) - 1)
            for layer in layers:
                inner[layer].append(states[layer + 1][r, rows].to(torch.bfloat16))
            final.append(states[-1][r, rows].to(torch.bfloat16))
    return LensData({k: torch.cat(v) for k, v in inner.items()}, torch.cat(final))


def frequent_tokens(samples: list[generate.Sample], n: int) -> torch.Tensor:
    """``n`` token ids, sorted: those the target chose most often in the training answers (held-out ones
    excluded), then, while fewer than ``n`` were seen, the lowest ids not yet in (a BPE vocabulary's ids
    follow its merge order, so the low ones are the common pieces)."""
    counts = Counter(t for s in samples if not s.heldout for t in s.output_ids)
    chosen = {t for t, _ in counts.most_common(n)}
    fill = 0
    while len(chosen) < n:
        chosen.add(fill)
        fill += 1
    return torch.tensor(sorted(chosen), dtype=torch.long)


def coverage(vocab: torch.Tensor | None, samples: list[generate.Sample]) -> float:
    """Share of the target's choices in ``samples`` that ``vocab`` holds (1.0 without a vocabulary)."""
    if vocab is None:
        return 1.0
    keep = set(vocab.tolist())
    chosen = [t for s in samples for t in s.output_ids]
    return sum(t in keep for t in chosen) / max(1, len(chosen))
