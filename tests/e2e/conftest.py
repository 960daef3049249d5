"""One real Tandem stack per test module (tests/support/tiny_stack.py): tiny models, gRPC on loopback, Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tiny_stack import Reference, Stack, save_tiny_pair, tiny_stack


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    return save_tiny_pair(tmp_path_factory.mktemp("e2e-models"))


@pytest.fixture(scope="session")
def reference(tiny_pair) -> Reference:
    return Reference(tiny_pair[0])


@pytest.fixture(scope="module")
def stack(tiny_pair) -> Iterator[Stack]:
    with tiny_stack(*tiny_pair) as running:
        yield running
