"""The fused decoder: embeddings, fused layers, final norm, as a drop-in for the transformers decoder.

    decoder = build(model, num_positions)          # None: this architecture runs through transformers
    out = decoder(input_ids=ids, position_ids=pos, tandem_backend=backend)   # ids, pos [1, T]
    out.last_hidden_state                          # [1, T, hidden], after the final norm

It has the transformers decoder's attributes that the engine reads one by one
(``embed_tokens``, ``layers``, ``rotary_emb``, ``norm``), with the same call
conventions, so early exit and feature capture run on it unchanged. The
embedding module and every weight but the merged projections are the
transformers model's own (tied embeddings stay tied).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from shared.engine.fused.layer import FusedDecoderLayer
from shared.engine.fused.norm import RMSNorm
from shared.engine.fused.rotary import DYNAMIC_ROPE_TYPES, RotaryTable

# model_type -> the transformers decoder layer class it must use (remote code reusing a name runs through transformers)
SUPPORTED = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
}


@dataclass
class DecoderOutput:
    last_hidden_state: torch.Tensor  # [1, T, hidden]


def unsupported_reason(model: nn.Module) -> str | None:
    """Why ``model`` cannot run on the fused decoder, or None when it can."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        return f"model type {model_type!r} is not one of {sorted(SUPPORTED)}"
    decoder = model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if not layers or any(type(layer).__name__ != SUPPORTED[model_type] for layer in layers):
        return f"its layers are not transformers' {SUPPORTED[model_type]}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (the fused MLP is SiLU-gated)"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") in DYNAMIC_ROPE_TYPES:
        return f"rope type {getattr(rotary, 'rope_type', None)!r} changes with the sequence length"
    return None


def build(model: nn.Module, num_positions: int) -> "FusedDecoder | None":
    """The fused decoder over ``model``'s weights (positions below ``num_positions``), or None when unsupported."""
    if unsupported_reason(model) is not None:
        return None
    return FusedDecoder(model.get_decoder(), model.config, num_positions)


class FusedDecoder(nn.Module):
    def __init__(self, hf_decoder: nn.Module, config, num_positions: int):
        super().__init__()
        self.config = config
        self.embed_tokens = hf_decoder.embed_tokens  # the model's module: tied LM heads keep reading it
        self.layers = nn.ModuleList(FusedDecoderLayer(layer, config) for layer in hf_decoder.layers)
        self.norm = RMSNorm.like(hf_decoder.norm)
        dtype = self.embed_tokens.weight.dtype
        self.rotary_emb = RotaryTable.from_hf(hf_decoder.rotary_emb, num_positions, dtype)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, tandem_backend, **_) -> DecoderOutput:
        """input_ids, position_ids [1, T] → DecoderOutput(last_hidden_state [1, T, hidden])."""
        hidden = self.embed_tokens(input_ids[0])  # [T, hidden]
        position_embeddings = self.rotary_emb(hidden, position_ids)  # [1, T, 1, D] each
        for layer in self.layers:
            hidden = layer(hidden, position_embeddings, tandem_backend)
        return DecoderOutput(self.norm(hidden)[None])
