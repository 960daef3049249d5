"""Attention backends behind one interface.

``sdpa``: torch scaled_dot_product_attention over gathered KV with explicit
masks (CPU and GPU reference). ``flashinfer``: paged prefill kernels with
custom tree masks (GPU only; imported lazily so a CPU machine never needs it).
"""

from shared.engine.attention.base import AttentionBackend, BatchLayout, SeqLayout, select_backend

__all__ = ["AttentionBackend", "BatchLayout", "SeqLayout", "select_backend"]
