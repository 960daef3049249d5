"""Fixtures of the model service tests (helpers: tests/support/model_services.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def draft_model_dir(tmp_path_factory) -> Path:
    """A tiny llama that disagrees with ``tiny_model_dir`` (1 layer, other seed): low acceptance."""
    from shared.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("models") / "tiny-draft", "llama", num_layers=1, seed=1)
