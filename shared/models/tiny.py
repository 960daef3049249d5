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
