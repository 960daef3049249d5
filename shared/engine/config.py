"""Engine configuration: every field has a default and a description."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field


def _env_flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() not in ("0", "false", "no", "off", "")


class EngineConfig(BaseModel):
    block_size: int = Field(16, ge=1, description="KV cache block (page) size in tokens.")
    num_blocks: int | None = Field(
        None, ge=1, description="KV blocks in the pool; None sizes it from kv_cache_bytes."
    )
    kv_cache_bytes: int = Field(
        256 * 1024**2, ge=1, description="Memory for the KV pool when num_blocks is None."
    )
    kv_grow_blocks: int = Field(
        0,
        ge=0,
        description="KV blocks the pool may add while a co-located draft is offloaded (Nightjar §5.1: the draft's "
        "weights and KV pool are worth this many target blocks); 0 = the pool keeps its start-up size.",
    )
    max_context: int | None = Field(
        None, ge=1, description="Longest sequence (committed + speculative); None = the model's max_position_embeddings."
    )
    cpu_prepack: bool = Field(
        True,
        description="On CPU in float32, multiply forwards of a few rows on by oneDNN-prepacked weights (cpu_linear.py); "
        "off = MKL's F.linear for every forward. Doubles the projections' memory.",
    )
    cpu_prepack_min_rows: int | None = Field(
        None,
        ge=1,
        description="Row count from which prepacked weights are used; None = measured when the model is loaded "
        "(where MKL stops being the faster path differs between CPUs).",
    )
    fused_layers: bool = Field(
        default_factory=lambda: _env_flag("TANDEM_FUSED_LAYERS", True),
        description="Run Llama, Mistral and Qwen2/Qwen3 models on the fused decoder (merged projections, one-op norms, "
        "cached rotary; shared/engine/fused); off = transformers' own layers. Other architectures always run through "
        "transformers. Default from TANDEM_FUSED_LAYERS (0 turns it off), else on.",
    )
    attention_backend: str = Field(
        "auto", description="auto (flashinfer on CUDA when installed, else sdpa), sdpa or flashinfer."
    )
    draft_top_k: int = Field(
        64, ge=1, description="When sampling, the draft samples from its top-k (after top-p) and reports that sparse q."
    )
    static_step: bool = Field(
        True,
        description="Greedy verify and decode steps of a target without early exit or features run the static path "
        "(static_step.py: the step staged in one copy, acceptance on the device, one host read; CUDA graphs on a GPU); "
        "off = every step through the eager forward.",
    )
    graph_warmup: bool = Field(
        False,
        description="On a GPU, capture the static step's CUDA graphs for decode and 4-token verifies at every batch "
        "bucket when the engine starts (cuda_graphs.GraphPool.warm); off = each bucket is captured on first use. "
        "The model services turn it on (ServiceSettings.engine_config); tests and benchmarks leave it off.",
    )
    device_sampling: bool | None = Field(
        None,
        description="Sampled verify steps on the static path: acceptance as batched tensor ops on the device, one host "
        "read (device_sampling.py); None = on a GPU, where the host walk's reads cost a sync each; False = the host walk.",
    )
    prefix_caching: bool = Field(
        default_factory=lambda: _env_flag("TANDEM_PREFIX_CACHE", True),
        description="Automatic prefix caching (prefix_cache.py): full KV blocks stay cached, keyed by a hash of their "
        "tokens and every block before them, and a new sequence shares every cached block of its prefix. Default "
        "from TANDEM_PREFIX_CACHE (0 turns it off), else on.",
    )
