"""A model directory's own tokenizer: whether it has one (tiny test models do not), and loading it.

Kept apart from the model loader so the scheduler, which needs only the tokenizer, never imports torch:
``AutoTokenizer`` reads the model's config through transformers' configuration code, which imports
torch (seconds, and hundreds of MB, in a process that runs no model). A directory whose
tokenizer_config names the generic fast tokenizer (SmolLM2's "TokenizersBackend") is loaded as that
class directly: the same class AutoTokenizer would pick, without the config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Files whose presence means a directory carries its own tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

# tokenizer_class values that name transformers' generic fast tokenizer (transformers 5 and 4).
GENERIC_FAST = ("TokenizersBackend", "PreTrainedTokenizerFast")


def has_tokenizer(model_dir: Path) -> bool:
    return model_dir.is_dir() and any((model_dir / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(model_dir: Path) -> Any:
    """The directory's tokenizer, as ``AutoTokenizer.from_pretrained`` loads it (local files only)."""
    if _tokenizer_class(model_dir) in GENERIC_FAST and (model_dir / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_dir, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, local_files_only=True)


def _tokenizer_class(model_dir: Path) -> str | None:
    try:
        return json.loads((model_dir / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None
