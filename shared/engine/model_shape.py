"""The target's shape as chunked prefill prices a chunk (scheduler/policies/prefill_split.py, ``pair_cost``).

    a token through the layers:      2 x layer_params FLOPs             (every decoder weight: one multiply-add)
    one attended (query, key) pair:  4 x attention_width x num_layers   (q.k, then the weighted sum of v)

Sent to the scheduler in the target's Info (ServiceInfo.attention_width, .layer_params; num_layers is there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    num_layers: int
    attention_width: int  # query heads x head dim
    layer_params: int  # the decoder layers' weights: no embeddings, no LM head


def model_shape(runner) -> ModelShape:
    """The shape of a runner's model: its config's heads, the weights of its decoder layers as they run."""
    cfg = runner.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    layers = runner.decoder.layers
    return ModelShape(len(layers), cfg.num_attention_heads * head_dim, sum(p.numel() for p in layers.parameters()))
