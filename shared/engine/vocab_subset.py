"""A draft's LM head restricted to a subset of the vocabulary (FR-Spec's frequency-ranked drafting).

On a small draft the LM head is most of the work: SmolLM2's is 49152 x 576,
28 M of the 38 M weights a three-layer draft reads per token. Drafting only
ever needs the tokens the target is likely to say, so the head computes
logits for a fixed subset ``ids`` (the most frequent tokens of the target's
own outputs) and leaves every other token at the dtype's minimum::

    hidden [N, H] ── @ weight[ids].T ──▶ [N, S] ── scatter into ──▶ logits [N, V]   (V - S entries = finfo.min)

The output keeps the full vocabulary, so token ids, beam search and the
acceptance rules need no mapping. Losslessness is untouched: a token outside
the subset simply has draft probability 0 (greedy: never proposed; sampling:
the target's residual distribution still produces it).

A model directory opts in with a ``vocab_subset.json`` file (``{"ids": [...]}``)
next to ``config.json``; ``loading.load_causal_lm`` installs the head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

FILE_NAME = "vocab_subset.json"


class SubsetLMHead(nn.Module):
    """logits[..., ids] = hidden @ weight[ids].T; every other vocabulary entry is finfo(dtype).min."""

    def __init__(self, full_weight: torch.Tensor, ids: torch.Tensor):
        super().__init__()
        vocab_size = full_weight.shape[0]
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"vocabulary subset must be non-empty ids in [0, {vocab_size})")
        if torch.unique(ids).numel() != ids.numel():
            raise ValueError("vocabulary subset has duplicate ids")
        self.vocab_size = vocab_size
        self.register_buffer("ids", ids.to(torch.long, copy=True), persistent=False)  # [S]
        self.register_buffer("weight", full_weight.detach()[self.ids].clone(), persistent=False)  # [S, H]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = hidden @ self.weight.T  # [..., S]
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), torch.finfo(sub.dtype).min)  # [..., V]
        return out.index_copy_(-1, self.ids, sub)


def install(model, ids: list[int] | torch.Tensor) -> SubsetLMHead:
    """Replace ``model``'s output embeddings by a SubsetLMHead over ``ids`` (the input embedding stays full)."""
    head = SubsetLMHead(model.get_output_embeddings().weight, torch.as_tensor(ids))
    model.lm_head = head  # Llama/Qwen/Mistral name; get_output_embeddings() returns it from now on
    if model.get_output_embeddings() is not head:
        raise ValueError(f"{type(model).__name__} does not keep its LM head in .lm_head")
    return head


def read(model_dir: Path) -> list[int] | None:
    """The subset a model directory asks for, or None when it has no ``vocab_subset.json``."""
    path = Path(model_dir) / FILE_NAME
    if not path.is_file():
        return None
    return [int(i) for i in json.loads(path.read_text())["ids"]]


def write(model_dir: Path, ids: list[int], **info: object) -> None:
    (Path(model_dir) / FILE_NAME).write_text(json.dumps({"ids": [int(i) for i in ids], **info}))
