"""Training the demo pair's feature-level draft (an EAGLE-3 head for SmolLM2-135M-Instruct) on this machine."""
