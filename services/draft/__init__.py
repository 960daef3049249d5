"""Draft service: the small model behind DraftService (prefill, batched chain/tree speculation, release)."""
