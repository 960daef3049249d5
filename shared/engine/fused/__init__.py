"""Fused decoder layers for the Llama, Mistral and Qwen2/Qwen3 families (decoder.py has the entry point).

The transformers model is loaded as usual, then its layers are repacked: merged
QKV and gate-up projections (repack.py), RMSNorm as one op (norm.py), rotary
from a cached cos/sin table (rotary.py), one KV store per layer through the
engine's attention backend (attention.py). Other architectures, and any model
``unsupported_reason`` names a reason for, keep running through transformers.
"""

from shared.engine.fused.decoder import SUPPORTED, DecoderOutput, FusedDecoder, build, unsupported_reason
from shared.engine.fused.model import FusedCausalLM

__all__ = ["SUPPORTED", "DecoderOutput", "FusedCausalLM", "FusedDecoder", "build", "unsupported_reason"]
