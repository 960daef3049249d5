"""Model artefacts: where they live, how the demo and test models are prepared, and which pairs exist."""
