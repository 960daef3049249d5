import pytest
from rich.console import Console

from shared.engine.loading import load_causal_lm
from shared.models import registry
from shared.models.paths import PREPARED_MARKER, Paths, is_prepared, resolve_home


def test_home_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("TANDEM_HOME", raising=False)
    assert resolve_home().parts[-2:] == (".cache", "tandem")
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path / "env"))
    assert resolve_home() == (tmp_path / "env").resolve()
    assert resolve_home(tmp_path / "explicit") == (tmp_path / "explicit").resolve()  # explicit wins
    paths = Paths.resolve(tmp_path)
    assert paths.model_dir("x") == tmp_path.resolve() / "models" / "x"


def test_unknown_pair():
    with pytest.raises(ValueError, match="known pairs: demo, eagle, tiny"):
        registry.get_pair("huge")


def test_demo_pair_is_listed_as_not_prepared_with_how_to_prepare(tmp_path):
    rows = registry.status(registry.get_pair("demo"), Paths.resolve(tmp_path))
    assert [(r.role, r.name, r.prepared, r.size_bytes) for r in rows] == [
        ("target", "smollm2-135m-instruct", False, 0),
        ("draft", "smollm2-draft", False, 0),
    ]
    assert all("tandem models prepare --pair demo" in r.note for r in rows)


def test_demo_draft_adapter_is_committed():
    from shared.models import smollm2_draft
    from shared.models.distill.draft import adapter_vocab

    assert smollm2_draft.ADAPTER.is_file()
    assert 1000 < len(adapter_vocab(smollm2_draft.ADAPTER)) <= 8192  # the tokens seen in training, at most 8k


def test_tiny_pair_prepares_idempotently_and_loads(tmp_path):
    paths, pair = Paths.resolve(tmp_path), registry.get_pair("tiny")
    console = Console(quiet=True)
    done = registry.prepare(pair, paths, console)
    assert set(done) == {"target", "draft"} and all(is_prepared(p) for p in done.values())
    mtime = (done["target"] / PREPARED_MARKER).stat().st_mtime_ns
    registry.prepare(pair, paths, console)  # second run: nothing rebuilt
    assert (done["target"] / PREPARED_MARKER).stat().st_mtime_ns == mtime

    rows = registry.status(pair, paths)
    assert all(r.prepared and r.size_bytes > 0 for r in rows)
    target, draft = load_causal_lm(done["target"]), load_causal_lm(done["draft"])
    assert target.vocab_size == draft.vocab_size  # a draft must speak the target's vocabulary
    assert draft.model.config.num_hidden_layers < target.model.config.num_hidden_layers
