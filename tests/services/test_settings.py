"""ServiceSettings: the TANDEM_* contract of docker-compose.yml, model resolution, ngram drafts, engine config."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
import yaml

from services.settings import ServiceSettings, ngram_name, parse_ngram_spec
from shared.engine.config import EngineConfig
from shared.engine.errors import ModelLoadError

ROOT = Path(__file__).resolve().parents[2]


def test_every_variable_compose_sets_is_a_field():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    fields = set(ServiceSettings.model_fields)
    for service in ("target", "draft", "scheduler"):
        env = {**compose["x-tandem-env"], **compose["services"][service]["environment"]}
        names = {k.removeprefix("TANDEM_").lower() for k in env if k.startswith("TANDEM_")}
        assert names <= fields, (service, names - fields)


def test_from_env_parses_and_overrides_win():
    env = {
        "TANDEM_HOST": "0.0.0.0",
        "TANDEM_PORT": "50052",
        "TANDEM_MODEL": "",  # compose's "unset"
        "TANDEM_TRACE_EXPORTER": "otlp",
        "TANDEM_NUM_BLOCKS": "128",
        "TANDEM_DRAFT_ADDR": "draft:50053",
        "OTHER_PORT": "1",
    }
    s = ServiceSettings.from_env(env=env, num_blocks=7)
    assert (s.host, s.port, s.model, s.trace_exporter, s.num_blocks) == ("0.0.0.0", 50052, None, "otlp", 7)
    assert s.draft_addr == "draft:50053" and s.listen_address("target") == "0.0.0.0:50052"
    assert ServiceSettings.from_env(env={}).listen_address("draft") == "127.0.0.1:50053"
    assert ServiceSettings(port=0, host="::1").listen_address("target") == "[::1]:0"
    assert ServiceSettings().tracing("draft").service_name == "draft"
    with pytest.raises(pydantic.ValidationError, match="port"):
        ServiceSettings.from_env(env={"TANDEM_PORT": "http"})


def test_engine_config_keeps_engine_defaults_for_unset_fields():
    assert ServiceSettings().engine_config().num_blocks is None
    config = ServiceSettings(num_blocks=9, block_size=4).engine_config()
    assert (config.num_blocks, config.block_size) == (9, 4)
    assert config.graph_warmup and not EngineConfig().graph_warmup  # services capture their graphs at start


def test_attention_backend_setting():
    assert ServiceSettings().engine_config().attention_backend == "auto"
    env = {"TANDEM_ATTENTION_BACKEND": "sdpa"}
    assert ServiceSettings.from_env(env=env).engine_config().attention_backend == "sdpa"
    with pytest.raises(pydantic.ValidationError, match="attention_backend"):
        ServiceSettings.from_env(env={"TANDEM_ATTENTION_BACKEND": "triton"})


def test_model_path_resolution(tmp_path):
    home = tmp_path / "home"
    target = home / "models" / "tiny-target"
    target.mkdir(parents=True)
    s = ServiceSettings(home=home, pair="tiny")
    assert s.model_path("target") == target
    assert ServiceSettings(home=home, model="tiny-target").model_path("draft") == target
    assert ServiceSettings(home=home, model=str(target)).model_path("draft") == target
    with pytest.raises(ModelLoadError, match="tandem models prepare --pair tiny"):
        s.model_path("draft")
    with pytest.raises(ModelLoadError, match="not found"):
        ServiceSettings(home=home, model="nope").model_path("target")
    with pytest.raises(ModelLoadError, match="unknown model pair"):
        ServiceSettings(home=home, pair="nope").model_path("target")


@pytest.mark.parametrize(
    "spec, sizes",
    [("ngram", (1, 4)), ("ngram:2-5", (2, 5)), ("ngram:3", (3, 3)), (" ngram:1-4 ", (1, 4)), ("ngram-x", None)],
)
def test_ngram_spec(spec, sizes):
    assert parse_ngram_spec(spec) == sizes
    s = ServiceSettings(model=spec, vocab_size=512)
    assert s.ngram("draft") == sizes
    if sizes is not None:
        assert ngram_name(*sizes) == f"ngram:{sizes[0]}-{sizes[1]}"
        with pytest.raises(ModelLoadError, match="model-free"):  # no path to load
            s.model_path("draft")
        with pytest.raises(ModelLoadError, match="target service needs a model"):
            s.ngram("target")


@pytest.mark.parametrize("spec", ["ngram:", "ngram:4-1", "ngram:0-2", "ngram:x", "ngram:1-", "ngram:1-2-3"])
def test_malformed_ngram_spec_fails_when_settings_are_read(spec):
    with pytest.raises(ValueError, match="malformed n-gram draft"):
        parse_ngram_spec(spec)
    with pytest.raises(pydantic.ValidationError, match="ngram:MIN-MAX|MIN <= MAX"):
        ServiceSettings.from_env(env={"TANDEM_MODEL": spec})


@pytest.mark.parametrize(
    ("spec", "chunk", "require_gain"),
    [("on", None, True), ("ON", None, True), ("chunk=2", 2, True), ("on:chunk=3,gain=false", 3, False)],
)
def test_frontier_setting(spec, chunk, require_gain):
    config = ServiceSettings.from_env(env={"TANDEM_FRONTIER": spec}).frontier_config()
    assert config is not None and config.chunk_size == chunk and config.require_gain is require_gain


@pytest.mark.parametrize("spec", ["", "off", "none", "0"])
def test_frontier_off(spec):
    assert ServiceSettings.from_env(env={"TANDEM_FRONTIER": spec}).frontier_config() is None


@pytest.mark.parametrize("spec", ["chunk", "size=2", "chunk=0", "on:alpha=2"])
def test_malformed_frontier_fails_when_read(spec):
    with pytest.raises(pydantic.ValidationError):
        ServiceSettings.from_env(env={"TANDEM_FRONTIER": spec})


def test_threads_setting():
    assert ServiceSettings.from_env(env={"TANDEM_THREADS": "3"}).threads == 3
    assert ServiceSettings.from_env(env={}).threads is None
    with pytest.raises(pydantic.ValidationError):
        ServiceSettings.from_env(env={"TANDEM_THREADS": "0"})
