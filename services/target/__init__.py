"""Target service: the large model behind TargetService (prefill, batched tree verification, release)."""
