"""GPU tests (marked ``gpu``, skipped without CUDA): fixtures; strict mode is in support.py."""

from __future__ import annotations

import pytest

from tests.gpu.support import missing


@pytest.fixture(scope="session")
def demo_pair(tandem_paths):
    """(target dir, draft dir) of the prepared demo pair; skip (fail under strict) when not prepared."""
    from shared.models.paths import is_prepared
    from shared.models.registry import get_pair

    pair = get_pair("demo")
    dirs = tuple(tandem_paths.model_dir(spec.name) for spec in (pair.target, pair.draft))
    not_ready = [str(d) for d in dirs if not is_prepared(d)]
    if not_ready:
        missing(f"demo pair not prepared ({', '.join(not_ready)}); run `make models`")
    return dirs
