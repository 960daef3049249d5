"""Chunked prefill on a model service: a long prompt runs in pieces, each in a step's one forward.

    PrefillItem(seq, prompt, max_tokens=C)            registers the whole prompt; computes its first C
                                                      uncached tokens (cached prefix blocks are free)
    PrefillItem(seq, [], max_tokens=C, resume=True)   the next C; the chunk that reaches the prompt's end
                                                      samples the first token (target) like a one-piece prefill

A sequence in the middle of its prefill takes no verify (target) and no
speculate (draft) until the chunk that ends it. Each chunk attends to every
position before it, already in the KV cache, so the KV and the first token
are those of a one-piece prefill (``tests/shared/engine/test_chunked_prefill.py``).
"""

from __future__ import annotations

from shared.engine.errors import InvalidRequestError, UnknownSequenceError
from shared.engine.sequence import Sequence
from shared.engine.types import PrefillItem


def check_chunk(item: PrefillItem) -> None:
    if item.max_tokens < 0:
        raise InvalidRequestError(f"sequence {item.seq_id!r}: max_tokens must be >= 0, got {item.max_tokens}")


def check_resume(runner, pending: set[str], item: PrefillItem) -> None:
    """A resumed chunk names a live sequence whose chunked prefill has not ended."""
    check_chunk(item)
    if item.seq_id not in runner.seqs:
        raise UnknownSequenceError(f"unknown sequence {item.seq_id!r} (resumed prefill)")
    if item.seq_id not in pending:
        raise InvalidRequestError(f"sequence {item.seq_id!r}: resume, but it has no chunked prefill in progress")
    if item.prompt_ids:
        raise InvalidRequestError(f"sequence {item.seq_id!r}: a resumed prefill carries no prompt tokens")


def progress(seq: Sequence, cached_before: int, num_fed: int) -> tuple[int, int]:
    """(prompt tokens in the KV cache now, how many of them the prefix cache served in this call)."""
    return seq.num_cached, max(0, seq.num_cached - cached_before - num_fed)
