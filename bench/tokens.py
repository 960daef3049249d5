"""Prompt text -> token ids, once, in the harness: every configuration gets the very same ids.

Tandem accepts text, but HF ``generate`` needs ids, and a peer that tokenized
differently would not be decoding the same thing. So the harness encodes each
prompt itself and sends ids to both:

    model with a tokenizer      chat template applied to one user message (the demo pair)
    model without one (tiny)    the UTF-8 bytes folded into the vocabulary: deterministic,
                                meaningless, enough for random models
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.workload import WorkItem

# Ids below this are left out of byte-folded prompts (tiny models have no special tokens,
# but keeping the first few free means a future BOS/EOS convention cannot collide).
_RESERVED_IDS = 4


@dataclass(frozen=True)
class EncodedItem:
    """A work item with its prompt as token ids (what is actually sent)."""

    item: WorkItem
    prompt_ids: tuple[int, ...]

    @property
    def index(self) -> int:
        return self.item.index


class PromptEncoder:
    def __init__(self, tokenizer: Any | None, vocab_size: int, max_prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_prompt_tokens = max_prompt_tokens

    @classmethod
    def for_model(cls, model_dir: Path, max_prompt_tokens: int = 768) -> PromptEncoder:
        """The encoder for the target at ``model_dir`` (its tokenizer when it has one)."""
        import json

        from shared.engine.tokenizer_dir import has_tokenizer

        config = json.loads((model_dir / "config.json").read_text())
        vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size"))
        tokenizer = None
        if has_tokenizer(model_dir):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        return cls(tokenizer, vocab, max_prompt_tokens)

    @property
    def eos_token_ids(self) -> list[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)

    def encode(self, text: str, messages: list[dict[str, str]] | None = None) -> tuple[int, ...]:
        """``text`` as one user message, or ``messages`` (a multi-turn transcript ending with it)."""
        messages = messages or [{"role": "user", "content": text}]
        if self.tokenizer is None:
            span = self.vocab_size - _RESERVED_IDS
            flat = "\n".join(m["content"] for m in messages)
            return tuple(_RESERVED_IDS + b % span for b in flat.encode("utf-8"))[: self.max_prompt_tokens]
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)  # transformers 5: BatchEncoding
        # An over-long prompt keeps its end: the generation prompt of the template must survive.
        return tuple(ids[-self.max_prompt_tokens :])

    def encode_all(self, items: Sequence[WorkItem]) -> list[EncodedItem]:
        return [EncodedItem(it, self.encode(it.prompt.text, it.prompt.messages())) for it in items]
