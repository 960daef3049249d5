"""Fixtures: the public servicer over toy fake workers (tests/support/fake_stack.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.scheduler.text import TextCodec
from tests.support.fake_stack import CharTokenizer, FakeStack, fake_stack


@pytest.fixture
def token_stack() -> Iterator[FakeStack]:
    """The servicer over fake workers, without a tokenizer (token-id prompts only)."""
    with fake_stack(None) as stack:
        yield stack


@pytest.fixture
def text_stack() -> Iterator[FakeStack]:
    """The servicer over fake workers with a character tokenizer whose "." is EOS."""
    with fake_stack(TextCodec(CharTokenizer())) as stack:
        yield stack
