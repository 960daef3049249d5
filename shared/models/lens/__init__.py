"""Training of the target's tuned lens (``shared/engine/tuned_lens.py``): ``python -m shared.models.lens``."""
