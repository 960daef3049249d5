"""Grammar state for structured output: one llguidance matcher per sequence, following its tokens.

Where the state lives: inside each model service, on the ``Sequence`` (``seq.grammar``), built at
prefill from the request's ``GrammarSpec`` and advanced lazily to whatever the sequence has
committed. Commit and rollback need no hook: before each use the matcher rolls back to the longest
common prefix of what it holds and what the sequence now holds, and consumes the rest::

    held:       prompt | o1 o2 o3 [d1 d2]        (matcher consumed o1..o3 + last step's tree path)
    committed:  prompt | o1 o2 o3  d1 b          (the target kept d1, then the bonus b)
    sync:       rollback 1 (d2), consume b       (one Rust call each)

A tree's masks come from the same matcher walked node by node (parents precede children, so
moving from one node's path to the next is a rollback to their common ancestor and one consume):
row 0 is the state after the committed tokens, row i + 1 the state after node i. Nothing crosses
the wire but the spec; the draft's and the target's matchers agree because both follow the same
committed tokens.

A token the grammar rejects is never consumed (``try_consume_tokens`` stops before it, and the
matcher stays usable); a path through it has no state, and its row is marked invalid. Once the
grammar is complete (``is_stopped``) only EOS is allowed; tokens committed after it are held
outside the matcher.

Measured on the demo tokenizer (SmolLM2, 49,152 tokens; ``python -m bench.grammar_masks``):
llguidance computes a JSON-schema mask in about 40 us median, compiles a schema in about 10 ms;
outlines-core's masks are faster (about 5 us) but its index takes about 1.5 s per new schema and
it rolls back only a bounded number of states, so a per-request schema would cost TTFT seconds.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shared.engine.errors import InvalidRequestError
from shared.engine.types import GRAMMAR_KINDS, GrammarSpec

REGEX_SPECIALS = set("\\.+*?()|[]{}^$#&-~/")
# JSON as json.dumps writes it on one line; free whitespace lets a weak model pad forever (a schema's
# "x-guidance" key overrides these)
JSON_LAYOUT = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def grammar_text(spec: GrammarSpec) -> str:
    """The llguidance grammar for ``spec``; raises InvalidRequestError naming what is wrong with it.

    Checks everything a tokenizer is not needed for (JSON, schema keywords, regex syntax), so the
    scheduler can refuse a bad request before it is queued.
    """
    from llguidance import LLMatcher

    if spec.kind not in GRAMMAR_KINDS:
        raise InvalidRequestError(f"grammar kind must be one of {', '.join(GRAMMAR_KINDS)}, got {spec.kind!r}")
    try:
        if spec.kind == "json_object":
            text = LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
        elif spec.kind == "json_schema":
            schema = json.loads(spec.spec)
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError("json_schema must be a JSON object (a JSON Schema)")
            text = LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        elif spec.kind == "regex":
            if not spec.spec:
                raise InvalidRequestError("regex must not be empty")
            text = LLMatcher.grammar_from_regex(spec.spec)
        else:
            text = LLMatcher.grammar_from_regex(choice_regex(spec.spec))
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        raise InvalidRequestError(f"{spec.kind}: {exc}") from None
    problem = LLMatcher.validate_grammar(text)
    if problem:
        raise InvalidRequestError(f"{spec.kind}: {problem.strip()}")
    return text


def choice_regex(choices_json: str) -> str:
    """A regex matching exactly one of the choices (a JSON list of non-empty strings)."""
    try:
        choices = json.loads(choices_json)
    except ValueError:
        raise InvalidRequestError("choice must be a JSON list of strings") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequestError("choice must be a non-empty list of non-empty strings")
    return "|".join("".join("\\" + ch if ch in REGEX_SPECIALS else ch for ch in c) for c in choices)


@dataclass
class GrammarStats:
    """Host time spent on grammars by one engine (what spans and metrics report per step)."""

    masks: int = 0  # rows whose mask was computed
    seconds: float = 0.0  # matcher time: sync, walk, masks

    def take(self) -> tuple[int, float]:
        """(masks, seconds) since the last take."""
        out = (self.masks, self.seconds)
        self.masks, self.seconds = 0, 0.0
        return out


class GrammarBook:
    """Compiles GrammarSpecs against one model's tokenizer, loaded on first use (about 3 s for 49k tokens).

    ``source``: a directory with a fast tokenizer, or the tokenizer itself.
    """

    def __init__(self, source: Path | Any, vocab_size: int):
        self.source = source
        self.vocab_size = vocab_size  # the model's logit columns (may differ from the tokenizer's)
        self._ll_tokenizer = None
        self.stats = GrammarStats()

    @property
    def ll_tokenizer(self):
        if self._ll_tokenizer is None:
            import llguidance.hf

            from shared.engine.tokenizer_dir import load_tokenizer

            tokenizer = load_tokenizer(self.source) if isinstance(self.source, Path) else self.source
            try:
                self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
            except ValueError as exc:  # not a fast tokenizer
                raise InvalidRequestError(f"structured output needs a fast tokenizer: {exc}") from None
        return self._ll_tokenizer

    def state(self, spec: GrammarSpec) -> GrammarState:
        """A fresh matcher for a sequence whose first ``spec.start`` tokens are outside the grammar (a draft
        prefilled in chunks may hold fewer than ``start`` tokens yet)."""
        from llguidance import LLMatcher

        if spec.start < 0:
            raise InvalidRequestError(f"grammar start must be >= 0, got {spec.start}")
        text = grammar_text(spec)
        matcher = LLMatcher(self.ll_tokenizer, text, log_level=0)
        if matcher.is_error():
            raise InvalidRequestError(f"{spec.kind}: {matcher.get_error().strip()}")
        return GrammarState(matcher, spec.start, self.ll_tokenizer.vocab_size, self.ll_tokenizer.eos_token, self.stats)


@dataclass
class GrammarState:
    """One sequence's matcher; ``held`` are the tokens (after ``start``) it has consumed."""

    matcher: Any  # llguidance.LLMatcher
    start: int
    tokenizer_vocab: int
    eos_token: int
    stats: GrammarStats
    held: list[int] = field(default_factory=list)
    words: int = 0  # int32 words per mask row

    def __post_init__(self) -> None:
        self.words = (self.tokenizer_vocab + 31) // 32

    def masks(self, committed: list[int], token_ids: list[int], parent_ids: list[int],
              rows: list[int] | None = None) -> tuple[np.ndarray, list[bool]]:  # fmt: skip
        """Masks for the rows of a tree on top of ``committed`` (the sequence's tokens, prompt included).

        Returns (bitmask ``[len(rows), words]`` int32, one bit per token, allowed = 1; valid per row).
        ``rows`` picks rows (0: the root, i + 1: node i), default all ``1 + len(token_ids)``. A row whose
        path holds a token the grammar rejects is invalid (and its mask allows everything, so no row
        is ever empty).
        """
        began = time.perf_counter()
        rows = list(range(1 + len(token_ids))) if rows is None else rows
        out = np.full((len(rows), self.words), -1, dtype=np.int32)  # [rows, words]
        base_ok = self._to(0, committed[self.start :])
        n = len(self.held)  # the committed part; every row's path goes on from here
        valid = [True] * len(rows)
        for k, row in enumerate(rows):
            if base_ok and self._to(n, _path(row - 1, token_ids, parent_ids)):
                self.matcher.unsafe_compute_mask_ptr(out[k].ctypes.data, out[k].nbytes)
                self.stats.masks += 1
            else:
                valid[k] = False
        self.stats.seconds += time.perf_counter() - began
        return out, valid

    def valid_nodes(self, committed: list[int], token_ids: list[int], parent_ids: list[int]) -> list[bool]:
        """Per node: does the grammar allow its path (every token on it, given its parent's state)?

        With no nodes: [whether it allows the committed tokens after ``start``]."""
        began = time.perf_counter()
        base_ok = self._to(0, committed[self.start :])
        n = len(self.held)
        ok: list[bool] = []
        paths: dict[int, list[int]] = {-1: []}
        for node, (token, parent) in enumerate(zip(token_ids, parent_ids)):
            paths[node] = paths[parent] + [token]
            ok.append((ok[parent] if parent >= 0 else base_ok) and self._to(n, paths[node]))
        self.stats.seconds += time.perf_counter() - began
        return ok if token_ids else [base_ok]

    def _to(self, n: int, path: list[int]) -> bool:
        """Bring the matcher to the state after ``held[:n] + path``; False when the grammar rejects a token.

        ``held[:n]`` is already right (n = 0: ``path`` is everything after ``start``). Once the grammar is
        complete, tokens after its end are held outside the matcher: such a path counts as valid when every
        one of them is EOS.
        """
        held = self.held
        common = min(len(held) - n, len(path))
        if held[n : n + common] != path[:common]:
            common = next(i for i, (a, b) in enumerate(zip(held[n:], path)) if a != b)
        if n + common < len(held):
            self.matcher.rollback(len(held) - n - common)
            del held[n + common :]
        rest = path[common:]
        if not rest:
            return True
        taken = self.matcher.try_consume_tokens(rest) if not self.matcher.is_stopped() else 0
        held.extend(rest[:taken])
        return taken == len(rest) or (self.matcher.is_stopped() and all(t == self.eos_token for t in rest[taken:]))


def _path(node: int, token_ids: list[int], parent_ids: list[int]) -> list[int]:
    """The tokens from the root down to ``node`` (node -1, the root itself: none)."""
    path = []
    while node >= 0:
        path.append(token_ids[node])
        node = parent_ids[node]
    return path[::-1]
