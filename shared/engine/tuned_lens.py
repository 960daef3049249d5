"""A tuned lens: one learned affine map per target layer that reads the final distribution off an intermediate layer.

FASER's early exit (§4.2) prunes a drafted token when it falls outside the top-K
of its parent row's *intermediate* logits. The paper reads them with the final
norm and LM head straight off layer l (the "logit lens"), which works for the
8B-class models it serves. SmolLM2-135M's middle layers do not rank the final
choice that way (``bench.diagnostics.exit_signal``: half of the accepted tokens fall outside
the logit lens's top 10 at L/2), so early exit there prunes accepted tokens as
often as rejected ones. A tuned lens (Belrose et al. 2023, "Eliciting Latent
Predictions from Transformers with the Tuned Lens") fixes the reading, not the
model: for each checked layer l a translator

    h'_l = h_l + A_l h_l + b_l          A_l: [H, H], b_l: [H], zero at init (= the logit lens)

trained so that ``lm_head(norm(h'_l))`` matches the target's last-layer
distribution (KL). The target's weights and outputs are untouched: acceptance
still tests every node against the last layer, so a lens can only change which
nodes early exit prunes, never what the target emits.

Stored next to the target as ``tuned_lens.safetensors`` (float16 ``translator.<l>.weight``,
``translator.<l>.bias``; the layer index l counts decoder layers from 0, the
hidden state *after* layer l; optional ``vocab``, below). Trained by
``python -m shared.models.lens``; the committed one lives in
``shared/models/weights/smollm2-lens/`` and ``tandem models prepare`` copies it
next to the target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

FILE_NAME = "tuned_lens.safetensors"


class TunedLens(nn.Module):
    """Per-layer residual affine translators; layers without one read through the plain logit lens.

    ``vocab`` (optional): the token ids the exit test ranks among (the target's most frequent choices).
    Ranking within a subset is conservative: a token outside the top-K of the subset is outside the
    top-K of the whole vocabulary, and a token not in the subset is never pruned. It cuts the test's
    cost, which on a small model is mostly the LM head (SmolLM2-135M: 49k x 576 against ~106M
    parameters in the layers, a quarter of a token's forward per checked row).
    """

    def __init__(self, hidden_size: int, layers: list[int], vocab: torch.Tensor | None = None):
        super().__init__()
        self.hidden_size = hidden_size
        self.translator = nn.ModuleDict({str(layer): nn.Linear(hidden_size, hidden_size) for layer in layers})
        for lin in self.translator.values():
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        self.vocab = None if vocab is None else vocab.to(torch.long)
        self.head_rows: torch.Tensor | None = None  # [V', H] the LM head's rows of ``vocab`` (attach_head)
        self.index: torch.Tensor | None = None  # [vocab_size] position in ``vocab``, -1 outside it

    def attach_head(self, lm_head_weight: torch.Tensor) -> None:
        """Slice the target's LM head to ``vocab`` (no-op without one). Raises ValueError on ids out of range."""
        if self.vocab is None:
            return
        size = lm_head_weight.shape[0]
        if int(self.vocab.max()) >= size or int(self.vocab.min()) < 0:
            raise ValueError(f"tuned lens vocabulary has ids outside the target's {size} tokens")
        device = lm_head_weight.device
        self.head_rows = lm_head_weight.detach()[self.vocab.to(device)].contiguous()
        self.index = torch.full((size,), -1, dtype=torch.long, device=device)
        self.index[self.vocab.to(device)] = torch.arange(self.vocab.numel(), device=device)

    @torch.no_grad()
    def tokens_above(self, layer: int, hidden: torch.Tensor, norm: nn.Module, lm_head: nn.Module,
                     parent_index: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """How many tokens score above each drafted token under its parent row's lens logits ([C] int).

        hidden: [P, H] parent rows after ``layer``; parent_index: [C] row of each token's parent;
        tokens: [C]. With a vocabulary, counts within it (0 for a token outside it: never pruned)."""
        h = norm(self(layer, hidden))
        if self.head_rows is None:
            logits = lm_head(h).float()  # [P, vocab]
            own = logits[parent_index, tokens]
            return (logits[parent_index] > own[:, None]).sum(-1)
        logits = torch.nn.functional.linear(h, self.head_rows).float()  # [P, V']
        sub = self.index[tokens]  # [C]
        own = logits[parent_index, sub.clamp(min=0)]
        above = (logits[parent_index] > own[:, None]).sum(-1)
        return torch.where(sub >= 0, above, torch.zeros_like(above))

    @property
    def layers(self) -> list[int]:
        return sorted(int(k) for k in self.translator)

    def has(self, layer: int) -> bool:
        return str(layer) in self.translator

    def forward(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """The hidden state after ``layer``, translated ([..., H] -> [..., H]); unchanged without a translator."""
        lin = self.translator[str(layer)] if self.has(layer) else None
        if lin is None:
            return hidden
        return hidden + lin(hidden)

    def save(self, directory: Path, meta: dict | None = None) -> Path:
        from safetensors.torch import save_file

        state = {f"translator.{k}.{p}": t.detach().to(torch.float16).contiguous() for k, lin in self.translator.items()
                 for p, t in (("weight", lin.weight), ("bias", lin.bias))}  # fmt: skip
        if self.vocab is not None:
            state["vocab"] = self.vocab.to(torch.int64).contiguous()
        Path(directory).mkdir(parents=True, exist_ok=True)
        path = Path(directory) / FILE_NAME
        tmp = path.with_suffix(".partial")
        save_file(state, str(tmp), metadata={"meta": json.dumps(meta or {})})
        tmp.replace(path)
        return path


def load(directory: Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> TunedLens | None:
    """The lens stored in ``directory``, or None when there is none. Raises ValueError on a malformed file."""
    path = Path(directory) / FILE_NAME
    if not path.is_file():
        return None
    from safetensors import safe_open

    weights: dict[int, dict[str, torch.Tensor]] = {}
    vocab = None
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():
            if key == "vocab":
                vocab = f.get_tensor(key)
                if vocab.dim() != 1 or vocab.numel() == 0:
                    raise ValueError(f"{path}: vocab must be a non-empty list of token ids")
                continue
            parts = key.split(".")
            if len(parts) != 3 or parts[0] != "translator" or parts[2] not in ("weight", "bias") or not parts[1].isdigit():
                raise ValueError(f"{path}: unexpected tensor {key!r}")
            weights.setdefault(int(parts[1]), {})[parts[2]] = f.get_tensor(key)
    if not weights:
        raise ValueError(f"{path}: no translators")
    hidden = next(iter(weights.values()))["weight"].shape[0]
    lens = TunedLens(hidden, sorted(weights), vocab)
    for layer, tensors in weights.items():
        if set(tensors) != {"weight", "bias"} or tensors["weight"].shape != (hidden, hidden):
            raise ValueError(f"{path}: translator {layer} is incomplete or not [{hidden}, {hidden}]")
        lin = lens.translator[str(layer)]
        lin.weight.data.copy_(tensors["weight"])
        lin.bias.data.copy_(tensors["bias"])
    return lens.to(device=device, dtype=dtype).eval().requires_grad_(False)


def read_meta(directory: Path) -> dict:
    """The training report stored with the lens ({} when there is no lens or no report)."""
    path = Path(directory) / FILE_NAME
    if not path.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return json.loads((f.metadata() or {}).get("meta", "{}"))
