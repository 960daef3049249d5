"""Shared fixtures: tiny random models (fast, every family) and the prepared SmolLM2 demo target.

torch and transformers are imported inside the fixtures, so test files that
never ask for a model (scheduler, policies) do not pay for the import.
"""

import sys
from pathlib import Path

import pytest

# Make the repo root importable (`import shared`) when pytest runs without an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.models.tiny import FAMILIES  # noqa: E402  (needs the path above)


def pytest_configure(config: pytest.Config) -> None:
    """Hold grpc.aio's process-wide state for the whole run, from the main thread.

    grpc.aio counts its live objects and, when the count drops to zero, shuts its completion queue down and
    joins the poller thread (a Python thread that runs only native code); the next test's channel or server
    starts a new one. Tests create and drop loops, channels and servers hundreds of times, and the drop can
    come from the garbage collector in the middle of an unrelated test. That shutdown/restart cycle races
    with the poller (grpc/grpc#22365, #43364); one extra reference taken here keeps one poller thread alive
    for the run, the way a service process (one loop, one server, for its whole life) already runs.
    """
    from grpc.experimental.aio import init_grpc_aio

    init_grpc_aio()


NOT_PREPARED = "SmolLM2 demo target not prepared under {home}; run `make models` (or `tandem models prepare --pair demo`)"


@pytest.fixture(scope="session")
def tiny_llama():
    """One tiny GQA llama shared by the whole session: read it, do not mutate it (build_tiny for a private one)."""
    from shared.models.tiny import build_tiny

    return build_tiny("llama")


@pytest.fixture(params=FAMILIES)
def tiny_family(request) -> str:
    """Parametrises a test over llama, qwen2, qwen3 and mistral."""
    return request.param


@pytest.fixture
def tiny_model(tiny_family):
    """A fresh tiny model of ``tiny_family`` (private to the test, so it may be mutated)."""
    from shared.models.tiny import build_tiny

    return build_tiny(tiny_family)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny llama saved as an HF directory (config.json + safetensors, no tokenizer)."""
    from shared.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("models") / "tiny-llama", "llama")


@pytest.fixture(scope="session")
def tandem_paths():
    from shared.models.paths import Paths

    return Paths.resolve()  # $TANDEM_HOME, else ~/.cache/tandem: where `make models` put things


@pytest.fixture(scope="session")
def smollm2_dir(tandem_paths) -> Path:
    """The prepared SmolLM2-135M-Instruct HF directory; skips when `make models` has not run."""
    from shared.models import smollm2
    from shared.models.paths import is_prepared

    path = smollm2.model_dir(tandem_paths)
    if not is_prepared(path):
        pytest.skip(NOT_PREPARED.format(home=tandem_paths.home))
    return path


@pytest.fixture(scope="session")
def smollm2_gguf(tandem_paths) -> Path:
    """The SmolLM2 .gguf that preparation extracted and kept; skips when absent."""
    from shared.models import smollm2

    path = smollm2.gguf_path(tandem_paths)
    if not path.is_file():
        pytest.skip(NOT_PREPARED.format(home=tandem_paths.home))
    return path
