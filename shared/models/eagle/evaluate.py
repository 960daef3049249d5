"""Held-out acceptance of the head: how long a greedy k-chain it drafts would the target accept?

For each held-out answer and each position p from the end of its prompt on,
the head drafts k tokens from the target's true features up to p (the
committed prefix); the target accepts them while they equal its own greedy
choices. Teacher-forced tokens are what the head would have been fed anyway
up to its first miss, so one unrolled forward (ttt.unroll) gives every
position's chain at once. Accepted length counts the bonus token: 1 + accepted.
"""

from __future__ import annotations

import torch

from shared.engine.eagle.model import Eagle3Head
from shared.models.eagle.data import Sequence
from shared.models.eagle.ttt import unroll


@torch.inference_mode()
def chain_acceptance(head: Eagle3Head, seqs: list[Sequence], k: int = 4) -> dict:
    ids_map = head.draft_to_target
    accepted: list[int] = []
    per_position = [0] * k
    for s in seqs:
        outs = unroll(head, s.ids[None], s.aux[None].float(), k)
        n = len(s.ids)
        guesses = [ids_map[head.logits(o[0]).argmax(-1)] for o in outs]  # per step [T] target ids
        for p in range(s.num_prompt - 1, n - 1):
            a = 0
            while a < k and p + a < n - 1 and int(guesses[a][p]) == int(s.labels[p + a]):
                a += 1
            accepted.append(a)
            for j in range(a):
                per_position[j] += 1
    total = max(1, len(accepted))
    return {
        "k": k,
        "positions": len(accepted),
        "mean_accepted_length": round(1 + sum(accepted) / total, 4),  # bonus token included
        "per_position_acceptance": [round(c / total, 4) for c in per_position],
        "first_token_agreement": round(per_position[0] / total, 4),
    }
