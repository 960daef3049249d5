"""Tiny random-init causal LMs for tests: real architectures, milliseconds to build.

The defaults use grouped-query attention (2 KV heads for 4 query heads) so
every engine test exercises the GQA path that real models (SmolLM2: 9/3) take.
Weights come from a private RNG seeded with ``seed``: the same arguments give
the same model, and building one leaves the global torch RNG untouched.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

Family = Literal["llama", "qwen2", "qwen3", "mistral"]
FAMILIES: tuple[Family, ...] = get_args(Family)

# Config class per family, by name: transformers is imported when a model is built, not when
# this module is (conftest reads FAMILIES at collection; torch + transformers cost ~5 s).
CONFIG_CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "mistral": "MistralConfig"}


def tiny_config(
    family: Family = "llama",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position_embeddings: int = 1024,
    **overrides: Any,
) -> PreTrainedConfig:
    import transformers

    if family not in CONFIG_CLASSES:
        raise ValueError(f"unknown family {family!r}; use one of {FAMILIES}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        # Qwen3 defaults head_dim to 128 whatever hidden_size is; pin it for every family.
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    if family == "mistral":
        fields["sliding_window"] = None  # full attention, like the other families at these lengths
    fields.update(overrides)
    return getattr(transformers, CONFIG_CLASSES[family])(**fields)


def build_tiny(
    family: Family = "llama",
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 1024,
    **overrides: Any,
) -> PreTrainedModel:
    """A float32 model in eval mode without grads; ``overrides`` go to the config (e.g. initializer_range)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_config(
        family,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        **overrides,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    model.requires_grad_(False)
    return model


def save_tiny(directory: str | Path, family: Family = "llama", **kwargs: Any) -> Path:
    """Build a tiny model and write it as an HF directory (config.json + model.safetensors, no tokenizer)."""
    directory = Path(directory)
    build_tiny(family, **kwargs).save_pretrained(directory)
    return directory


def save_tiny_eagle(
    directory: str | Path,
    target_dir: str | Path,
    *,
    aux_layer_ids: list[int] | None = None,
    draft_vocab_size: int | None = None,
    seed: int = 0,
    with_embedding: bool = False,
) -> Path:
    """A random EAGLE-3 head for a tiny target, in the published layout (no embedding unless asked).

    ``draft_vocab_size`` below the target's keeps every other token id (a d2t
    map that is not the identity), so tests exercise the vocabulary mapping.
    """
    import json

    import torch

    from shared.engine.eagle.loading import save_head
    from shared.engine.eagle.model import Eagle3Config, Eagle3Head

    raw = json.loads((Path(target_dir) / "config.json").read_text())
    layers = raw["num_hidden_layers"]
    vocab = raw["vocab_size"]
    draft_vocab = draft_vocab_size or vocab
    cfg = Eagle3Config(
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw["num_key_value_heads"],
        head_dim=raw.get("head_dim") or 0,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=raw["hidden_size"],
        aux_layer_ids=aux_layer_ids if aux_layer_ids is not None else [0, layers // 2, layers],
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        rope_theta=(raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", 10000.0)),
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
    )
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.05)
    for norm in (head.norm, head.midlayer.input_layernorm, head.midlayer.hidden_norm, head.midlayer.post_attention_layernorm):
        torch.nn.init.ones_(norm.weight)
    if draft_vocab < vocab:
        keep = torch.arange(0, vocab, max(1, vocab // draft_vocab))[:draft_vocab]
        head.d2t.copy_(keep - torch.arange(draft_vocab))
    return save_head(head, directory, dtype=torch.float32, with_embedding=with_embedding)
