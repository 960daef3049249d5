"""Text <-> token ids for the public endpoint, with the target model's tokenizer.

The scheduler is the only service that sees text: clients may send a prompt
as text, and every streamed chunk carries the text its tokens add. Draft and
target work on token ids only. A server whose target directory has no
tokenizer (the tiny test models) still serves token-id prompts; text prompts
and stop strings then fail with FAILED_PRECONDITION.

Output text leaves special tokens out (an end-of-sequence marker is a finish
reason, not text). Streaming text is decoded incrementally (the TGI / vLLM scheme): a token can
be half of a UTF-8 character or change how the previous one renders (a
leading space), so each chunk's text is the difference between decoding a
short window with and without the new tokens, held back while it ends in an
incomplete character (U+FFFD)::

    ids:   ... | prefix ........ read | new ...
                 decode(prefix:read)  -> already sent
                 decode(prefix:)      -> its extra suffix is this chunk's text
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.scheduler.errors import NoTokenizerError, TandemRequestError
from shared.engine.tokenizer_dir import has_tokenizer, load_tokenizer

log = logging.getLogger(__name__)

_INCOMPLETE = "\ufffd"
# apply_chat_template's own arguments: a client's template variables may not override how it is called
_RESERVED_TEMPLATE_ARGS = frozenset({"conversation", "tokenize", "return_dict", "return_tensors", "padding",
                                     "truncation", "max_length", "tokenizer_kwargs", "chat_template",
                                     "continue_final_message", "return_assistant_tokens_mask"})  # fmt: skip


class TextCodec:
    """Encode prompts, decode outputs, and name the end-of-sequence ids of one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        eos = getattr(tokenizer, "eos_token_id", None)
        self.eos_token_ids: tuple[int, ...] = (eos,) if isinstance(eos, int) else tuple(eos or ())

    @classmethod
    def load(cls, model_dir: str | Path) -> TextCodec | None:
        """The tokenizer of a Hugging Face model directory; None when it has none (token ids only)."""
        path = Path(model_dir).expanduser()
        if not has_tokenizer(path):
            log.info("no tokenizer in %s: serving token-id prompts only", path)
            return None
        return cls(load_tokenizer(path))  # seconds to import transformers; only servers with text pay for it

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:  # fmt: skip
        """The conversation rendered by the tokenizer's chat template, ending with the assistant's turn opened.

        ``template_kwargs`` are extra variables for the template (e.g. ``enable_thinking``). Raises
        ``NoTokenizerError`` when the tokenizer has no template and ``TandemRequestError`` with the
        template's own complaint (e.g. roles out of order); both are the client's to fix."""
        if not self.has_chat_template:
            raise NoTokenizerError("the target's tokenizer has no chat template; send the prompt as text or token ids")
        extra = dict(template_kwargs or {})
        reserved = sorted(set(extra) & _RESERVED_TEMPLATE_ARGS)
        if reserved:
            raise TandemRequestError(f"chat_template_kwargs may not set {', '.join(reserved)}")
        try:
            encoded = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                         tokenize=True, **extra)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the template's own complaint, for the client
            raise TandemRequestError(f"the chat template rejected the messages: {exc}") from None
        return list(encoded["input_ids"]) if hasattr(encoded, "keys") else list(encoded)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token's own text, special tokens included (what log-probabilities are keyed by)."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def encode_plain(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def stream(self) -> IncrementalDecoder:
        return IncrementalDecoder(self.decode)


class IncrementalDecoder:
    """Turns a request's tokens, fed chunk by chunk, into text deltas whose concatenation is the output."""

    def __init__(self, decode: Any) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # tokens whose text has been sent

    def push(self, token_ids: Sequence[int]) -> str:
        """Text the new tokens add; "" while they end inside a multi-byte character."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back (the request ended)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read == len(self._ids):
            return ""
        sent = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(sent) or (text.endswith(_INCOMPLETE) and not final):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(sent) :]
