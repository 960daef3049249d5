"""deploy/kubernetes: every hop over TLS with cert-manager's certificates. Each probe and each TLS setting
points at a file of a mounted Secret that a Certificate fills; the names the probes and the scheduler check
are in those certificates; the settings parse into mutual TLS inside and TLS outside."""

from __future__ import annotations

from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is in tandem[dev]")

from services.settings import ServiceSettings  # noqa: E402
from shared.rpc.health_probe import client_tls  # noqa: E402
from shared.rpc.server import DRAFT_SERVICE, TANDEM_SERVICE, TARGET_SERVICE  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "deploy" / "kubernetes"
SERVICES = {"target": TARGET_SERVICE, "draft": DRAFT_SERVICE, "scheduler": TANDEM_SERVICE}
SECRET_FILES = {"tls.crt", "tls.key", "ca.crt"}  # what cert-manager writes into a Certificate's Secret


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DIR / name).read_text()) if d]


def _kind(docs, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module")
def manifests():
    docs = _docs("tandem.yaml")
    certs = {c["spec"]["secretName"]: c["spec"] for c in _kind(_docs("certificates.yaml"), "Certificate").values()}
    return _kind(docs, "Deployment"), _kind(docs, "Service"), certs


def _container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _secret_of(deployment: dict, path: str) -> str:
    """The Secret behind the mount that holds ``path`` (which must be one of cert-manager's files)."""
    mounts = {m["mountPath"]: m["name"] for m in _container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    directory, file = path.rsplit("/", 1)
    assert file in SECRET_FILES and directory in mounts, path
    return volumes[mounts[directory]]["secret"]["secretName"]


def _env(deployment: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "from-secret") for e in _container(deployment)["env"]}


def test_probes_dial_with_the_certificates_each_service_serves(manifests):
    deployments, services, certs = manifests
    for name, grpc_service in SERVICES.items():
        d = deployments[name]
        container = _container(d)
        port = int(_env(d)["TANDEM_PORT"])
        assert services[name]["spec"]["ports"][0]["port"] == port
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[probe]["exec"]["command"]
            assert command[:5] == ["python", "-m", "shared.rpc.health_probe", f"127.0.0.1:{port}", grpc_service]
            flags = dict(zip(command[5::2], command[6::2]))
            for flag in ("--ca", "--cert", "--key"):
                if flag in flags:
                    assert _secret_of(d, flags[flag]) in certs
            tls = client_tls(False, flags.get("--ca"), flags.get("--cert"), flags.get("--key"), flags.get("--server-name"))
            assert tls is not None and tls.ca is not None  # every probe speaks TLS
            served = certs[_secret_of(d, _env(d)["TANDEM_INTERNAL_TLS_CERT" if name != "scheduler" else "TANDEM_TLS_CERT"])]
            if tls.server_name:
                assert tls.server_name in served["dnsNames"] and tls.server_name == name
            else:
                assert "127.0.0.1" in served["ipAddresses"]
            if name != "scheduler":  # mutual TLS: the probe presents the service's own client-capable certificate
                assert tls.cert is not None and "client auth" in served["usages"]


def test_settings_are_mutual_tls_inside_and_tls_outside(manifests):
    deployments, _, certs = manifests
    for name in ("target", "draft"):
        env = _env(deployments[name])
        tls = ServiceSettings.from_env(env=env).internal_server_tls()
        assert tls is not None and tls.mutual and env["TANDEM_INTERNAL_SECRET"] == "from-secret"
        assert certs[_secret_of(deployments[name], str(tls.cert))]["dnsNames"][0] == name
    env = _env(deployments["scheduler"])
    settings = ServiceSettings.from_env(env=env)
    client = settings.internal_client_tls()
    assert client is not None and client.cert is not None  # presents tandem-scheduler-tls
    assert "client auth" in certs[_secret_of(deployments["scheduler"], str(client.cert))]["usages"]
    assert settings.public_tls() is not None and env["TANDEM_API_KEYS"] == "from-secret"
    for role in ("target", "draft"):  # the names the scheduler dials are in the services' certificates
        host = env[f"TANDEM_{role.upper()}_ADDR"].split(":")[0]
        assert host in certs[f"tandem-{role}-tls"]["dnsNames"]


def test_only_the_scheduler_reaches_the_model_services_and_redis_and_the_target_the_draft():
    policies = _kind(_docs("tandem.yaml"), "NetworkPolicy")
    policy, to_draft = policies["tandem-internal"], policies["tandem-target-to-draft"]
    assert set(policies) == {"tandem-internal", "tandem-target-to-draft"}
    # the target dials the draft itself (relay, feature rows): its gRPC port and relay socket, from the target only
    assert to_draft["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "draft"
    (only,) = to_draft["spec"]["ingress"]
    assert only["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "target"
    assert only["ports"] == [{"port": "grpc", "protocol": "TCP"}, {"port": "relay", "protocol": "TCP"}]
    draft = _kind(_docs("tandem.yaml"), "Deployment")["draft"]
    relay_port = int(_env(draft)["TANDEM_RELAY_SOCKET_PORT"])  # pinned: a Service routes declared ports only
    assert {"name": "relay", "containerPort": relay_port} in _container(draft)["ports"]
    assert {"name": "relay", "port": relay_port, "targetPort": "relay"} in _kind(_docs("tandem.yaml"), "Service")["draft"]["spec"]["ports"]
    guarded = policy["spec"]["podSelector"]["matchExpressions"][0]["values"]
    assert set(guarded) == {"target", "draft", "redis"}
    rule, scrape = policy["spec"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "scheduler"
    assert "ports" not in rule  # the scheduler: every port
    # Prometheus (namespace monitoring): only the named metrics port, which only the model services have
    assert scrape["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert scrape["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    deployments = _kind(_docs("tandem.yaml"), "Deployment")
    for name in ("target", "draft", "redis"):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        has_metrics = any(p.get("name") == "metrics" for p in container.get("ports", []))
        assert has_metrics == (name != "redis"), name
