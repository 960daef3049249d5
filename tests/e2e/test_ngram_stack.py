"""The model-free n-gram draft in a real stack: draft service (prompt lookup) + tiny target + scheduler + Redis.

The tiny random target falls into loops on a repetitive prompt, so its own
output is copy-heavy: prompt lookup should get drafts accepted there, and the
output must stay token-for-token the target's greedy output.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sdk import Client, FinishReason
from tests.support.tiny_stack import VOCAB, Stack, tiny_stack

COPY_HEAVY = [7, 8, 9] * 3  # the tiny target answers 35 35 35 ... 399 35 399 35 ... 152 9 64 152 9 64 ...


@pytest.fixture(scope="module")
def ngram_stack(tiny_pair) -> Iterator[Stack]:
    with tiny_stack(tiny_pair[0], "ngram:1-4", vocab_size=VOCAB) as running:
        yield running


def test_ngram_draft_is_lossless_and_accepted_on_copy_heavy_output(ngram_stack, reference):
    with Client(ngram_stack.address, timeout=120) as client:
        info = client.info()
        assert info.draft is not None and info.draft.model_name == "ngram:1-4"
        assert (info.draft.kv_blocks_total, info.draft.dtype) == (0, "none")
        copy = client.generate(COPY_HEAVY, max_new_tokens=40, speculation=4)
        other = client.generate([3, 1, 4, 1, 5], max_new_tokens=24, speculation="auto")
        plain = client.generate(COPY_HEAVY, max_new_tokens=40, speculation="off")
    assert copy.token_ids == plain.token_ids == reference.greedy(COPY_HEAVY, 40)
    assert other.token_ids == reference.greedy([3, 1, 4, 1, 5], 24)
    assert all(r.finish_reason == FinishReason.LENGTH for r in (copy, other, plain))
    assert copy.stats.num_draft_tokens > 0 and copy.stats.num_accepted_tokens > 0
    assert copy.stats.mean_accepted_length > 1  # fewer verify steps than tokens
    assert plain.stats.num_draft_tokens == 0
