"""The EAGLE-3 draft head: one decoder layer over [token embedding, target features], in the published layout.

What the head computes per position p (Li et al., EAGLE-3; the layout vLLM's and
SGLang's ``LlamaForCausalLMEagle3`` load)::

    x_p ──embed_tokens──▶ e_p ──input_layernorm──┐
                                                  cat ──▶ q,k,v (2H → heads) ──RoPE(p)──▶ attention ──o_proj──▶ + ──▶ h
    f_{p-1} ──fc (3·H_t → H, once)──▶ g_p ──hidden_norm──┘                                              ▲
                                     └──────────────────────────────── residual ──────────────────────────┘
    h ──post_attention_layernorm──▶ mlp ──▶ + h ──▶ o_p (pre-norm output) ──norm──▶ lm_head ──▶ draft-vocab logits

``f_{p-1}`` is the target's feature of the token *before* x_p: the hidden
states at ``aux_layer_ids`` of the target, concatenated (3·H_t wide).
Drafting past the committed tokens feeds the head's own pre-norm output
``o_p`` instead (H wide, fc skipped): EAGLE's feature extrapolation.

Checkpoint files (a directory): ``config.json`` with ``architectures:
["LlamaForCausalLMEagle3"]``, ``hidden_size``, ``intermediate_size``,
``num_attention_heads``, ``num_key_value_heads``, ``rms_norm_eps``,
``rope_theta`` (or ``rope_parameters``), ``vocab_size`` (the target's),
``draft_vocab_size``, optional ``target_hidden_size`` and
``eagle_config.eagle_aux_hidden_state_layer_ids``; weights ``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t`` (draft id → target id offset)
and optionally ``t2d`` and ``embed_tokens.weight`` (else the target's
embedding is loaded from the target's directory).

Aux layer id i names the hidden state *entering* the target's decoder layer
i (vLLM's convention); i = num_hidden_layers names the last layer's output
before the final norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int]
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    norm_before_residual: bool = False  # some exports normalise the feature before it becomes the residual
    extra: dict = field(default_factory=dict)  # other keys of config.json, kept on save

    def __post_init__(self) -> None:
        if not self.head_dim:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def feature_width(self) -> int:
        """Bytes-on-the-wire width of one token's target features: len(aux layers) x target hidden size."""
        return len(self.aux_layer_ids) * self.target_hidden_size

    @staticmethod
    def default_aux_layers(num_target_layers: int) -> list[int]:
        """vLLM's default for EAGLE-3 heads that name none: low, middle and high (2, N/2, N-3)."""
        return [2, num_target_layers // 2, num_target_layers - 3]

    @classmethod
    def from_json(cls, raw: dict, *, num_target_layers: int | None = None) -> "Eagle3Config":
        eagle = raw.get("eagle_config") or {}
        aux = eagle.get("eagle_aux_hidden_state_layer_ids") or raw.get("aux_layer_ids")
        if aux is None:
            if num_target_layers is None:
                raise ValueError("the head names no eagle_aux_hidden_state_layer_ids and the target's depth is unknown")
            aux = cls.default_aux_layers(num_target_layers)
        rope = raw.get("rope_parameters") or {}
        known = {
            "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
            "draft_vocab_size", "target_hidden_size", "head_dim", "rms_norm_eps", "rope_theta", "rope_parameters",
            "max_position_embeddings", "eagle_config", "aux_layer_ids", "norm_before_residual",
        }  # fmt: skip
        return cls(
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads", raw["num_attention_heads"]),
            vocab_size=raw["vocab_size"],
            draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            target_hidden_size=raw.get("target_hidden_size") or raw["hidden_size"],
            aux_layer_ids=[int(i) for i in aux],
            head_dim=raw.get("head_dim") or 0,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=raw.get("rope_theta") or rope.get("rope_theta", 10000.0),
            max_position_embeddings=raw.get("max_position_embeddings", 8192),
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def to_json(self) -> dict:
        return {
            **self.extra,
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "norm_before_residual": self.norm_before_residual,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)},
        }

    def llama(self) -> LlamaConfig:
        """The LlamaConfig the shared transformers blocks (norm, MLP, RoPE) are built from."""
        return LlamaConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            num_hidden_layers=1,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            max_position_embeddings=self.max_position_embeddings,
            hidden_act="silu",
        )


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.layer_idx = 0
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.head_dim**-0.5
        width = 2 * cfg.hidden_size  # [embedding, feature]
        self.q_proj = nn.Linear(width, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(width, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [B, T, 2H] → q [B, heads, T, D], k/v [B, kv_heads, T, D], RoPE applied."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend=None) -> torch.Tensor:
        """x [B, T, 2H] → [B, T, H]. With a Tandem attention backend (paged KV, tree masks), else causal SDPA."""
        q, k, v = self.qkv(x, cos, sin)
        if backend is not None:
            out = backend.attend(self.layer_idx, q, k, v, self.scaling)  # [1, T, heads, D]
        else:
            rep = self.num_heads // self.num_kv_heads
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True, scale=self.scaling
            ).transpose(1, 2)  # [B, T, heads, D]
        return self.o_proj(out.reshape(*x.shape[:2], -1))


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        llama = cfg.llama()
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.mlp = LlamaMLP(llama)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, embeds, feats, cos, sin, backend=None) -> torch.Tensor:
        """embeds, feats [B, T, H] → pre-norm output [B, T, H]."""
        normed = self.hidden_norm(feats)
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [B, T, 2H]
        h = self.self_attn(x, cos, sin, backend) + (normed if self.norm_before_residual else feats)
        return self.mlp(self.post_attention_layernorm(h)) + h


class Eagle3Head(nn.Module):
    """The head plus the target's token embedding (frozen); ``forward`` returns pre-norm outputs."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(cfg.feature_width, cfg.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(cfg.llama())
        # draft id i is target id i + d2t[i] (EAGLE-3's layout); identity when the draft vocab is the target's
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.config = cfg.llama()  # what the paged KV cache and the runner read (1 layer, kv heads, head_dim)

    # the few transformers-model methods ModelRunner calls
    def set_attn_implementation(self, name: str) -> None:
        """The head's attention calls the Tandem backend directly; nothing to switch."""

    def get_decoder(self) -> "Eagle3Head":
        return self

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def draft_to_target(self) -> torch.Tensor:
        """[draft_vocab] target token id of each draft logit."""
        return torch.arange(self.cfg.draft_vocab_size, device=self.d2t.device) + self.d2t

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Target features [.., 3·H_t] → the head's feature space [.., H]."""
        return self.fc(aux)

    def forward(self, input_ids: torch.Tensor, feats: torch.Tensor, position_ids: torch.Tensor, backend=None) -> torch.Tensor:
        """input_ids [B, T], feats [B, T, H] (fused), position_ids [B, T] → pre-norm outputs [B, T, H]."""
        embeds = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(embeds, position_ids)
        return self.midlayer(embeds, feats.to(embeds.dtype), cos, sin, backend)

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [N, H] → draft-vocab logits [N, draft_vocab]."""
        return self.lm_head(self.norm(outputs))


def head_state_keys(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoint names → module names (some exports prefix ``model.`` or name the layer ``layers.0``)."""
    out = {}
    for key, value in sd.items():
        key = key.removeprefix("model.")
        if key.startswith("layers.0."):
            key = "midlayer." + key[len("layers.0.") :]
        out[key] = value
    return out


def read_config(head_dir: Path) -> dict:
    return json.loads((Path(head_dir) / "config.json").read_text())
