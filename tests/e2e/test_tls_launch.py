"""TLS through `tandem up`'s launcher, real processes: the public endpoint alone, then public plus mutual TLS
between the scheduler and the model services. The launcher's probes use the credentials each service
serves; the SDK and the CLI get a one-line error for a plaintext client at a TLS port within 5 s; certificates
replaced on disk are served to new connections; an unusable certificate or key stops startup within 10 s
with a line naming the file."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time

import grpc
import pytest
from typer.testing import CliRunner

from sdk import AsyncClient, Client
from sdk.cli import app
from sdk.errors import PermissionDeniedError, TlsMismatchError
from services.launcher import REPO_ROOT, LaunchConfig, LaunchError, launch
from shared.rpc import health_probe
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2_grpc
from shared.rpc.server import TANDEM_SERVICE, TARGET_SERVICE
from shared.rpc.tls import ClientTls
from tests.support.certs import TestCA, der, replace_files, self_signed, served_certificate

KEY = "tls-test-key"
PLAINTEXT = "speaks TLS but this client dialled it in plaintext"


def _config(tmp_path, **tls) -> LaunchConfig:
    return LaunchConfig(port=0, metrics_port=None, device="cpu", log_dir=tmp_path / "logs", startup_timeout_s=180,
                        extra_env={"TANDEM_API_KEYS": KEY}, **tls)


def _until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_public_tls_served_refused_and_rotated(tiny_pair, tmp_path):
    target_dir, _ = tiny_pair
    cert, key = self_signed(tmp_path / "public")
    config = _config(tmp_path, target_model=str(target_dir), draft_model="ngram:1-3", http_port=0)
    config.extra_env.update(TANDEM_TLS_CERT=str(cert), TANDEM_TLS_KEY=str(key))  # as a user's environment would
    with launch(config) as stack:
        address = stack.endpoints.scheduler
        assert stack.endpoints.tls_ca == cert and stack.endpoints.http_url.startswith("https://")
        with Client(address, root_certificates=cert, api_key=KEY, timeout=60) as client:  # CA + the right key
            assert len(client.generate([1, 2, 3], max_new_tokens=4).token_ids) == 4
        with Client(address, root_certificates=cert, api_key="", timeout=60) as client:  # no key
            assert client.health() == "SERVING"  # probes need none
            with pytest.raises(PermissionDeniedError) as info:
                client.generate([1, 2, 3], max_new_tokens=4)
            assert info.value.code == "UNAUTHENTICATED"

        started = time.monotonic()
        with Client(address, api_key=KEY, timeout=60) as plain, pytest.raises(TlsMismatchError) as info:
            plain.generate([1, 2, 3], max_new_tokens=4)
        assert time.monotonic() - started < 5 and PLAINTEXT in str(info.value) and "\n" not in str(info.value)

        async def async_plain() -> str:
            async with AsyncClient(address, api_key=KEY, timeout=60) as c:
                with pytest.raises(TlsMismatchError) as info:
                    await c.info()
                return str(info.value)

        assert PLAINTEXT in asyncio.run(asyncio.wait_for(async_plain(), 5))

        runner = CliRunner(env={"TANDEM_API_KEY": KEY})
        ok = runner.invoke(app, ["status", "--addr", address, "--ca", str(cert)])
        assert ok.exit_code == 0 and "SERVING" in ok.output, ok.output
        refused = runner.invoke(app, ["status", "--addr", address])
        assert refused.exit_code == 1 and PLAINTEXT in refused.output, refused.output
        generated = runner.invoke(app, ["generate", "1,2,3", "--ids", "--max-new-tokens", "3", "--addr", address,
                                        "--ca", str(cert)])
        assert generated.exit_code == 0, generated.output

        import httpx  # the HTTP API serves the same certificate

        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert)), timeout=30) as http:
            assert http.get(f"{stack.endpoints.http_url}/health").status_code == 200

        new_cert, new_key = self_signed(tmp_path / "rotated")  # a renewed certificate, written over the old files
        replace_files({new_cert: cert, new_key: key})
        host_port = address
        assert _until(lambda: served_certificate(host_port) == der(new_cert))
        with Client(address, root_certificates=new_cert.read_bytes(), api_key=KEY, timeout=60) as client:
            assert len(client.generate([4, 5, 6], max_new_tokens=3).token_ids) == 3
        https = stack.endpoints.http_url.removeprefix("https://")
        assert _until(lambda: served_certificate(https) == der(new_cert), 30)  # HTTPS looks every 10 s


def test_public_and_internal_mutual_tls(tiny_pair, tmp_path):
    target_dir, draft_dir = tiny_pair
    ca = TestCA()
    roots = ca.write(tmp_path / "ca.crt")
    public_cert, public_key = ca.issue(tmp_path / "public")
    internal_cert, internal_key = ca.issue(tmp_path / "internal")
    config = _config(tmp_path, target_model=str(target_dir), draft_model=str(draft_dir),
                     tls_cert=public_cert, tls_key=public_key, tls_ca=roots,
                     internal_tls_cert=internal_cert, internal_tls_key=internal_key, internal_tls_ca=roots,
                     internal_mtls=True)
    with launch(config) as stack:
        e = stack.endpoints
        with Client(e.scheduler, root_certificates=roots, api_key=KEY, timeout=60) as client:
            result = client.generate([3, 1, 4, 1, 5], max_new_tokens=8, speculation=2)
            assert len(result.token_ids) == 8 and result.stats.num_draft_tokens > 0  # the draft, over mutual TLS
            assert client.info().draft is not None

        # a stray client at the target: no certificate -> no connection; certificate but no secret -> refused
        assert health_probe.check(e.target, TARGET_SERVICE, tls=ClientTls(ca=roots)) == "UNREACHABLE"
        assert health_probe.check(e.target, TARGET_SERVICE) == "UNREACHABLE"
        assert health_probe.check(e.scheduler, TANDEM_SERVICE, tls=ClientTls(ca=roots)) == "SERVING"
        stray = ClientTls(ca=roots, cert=internal_cert, key=internal_key)
        with grpc.secure_channel(e.target, stray.credentials()) as channel:
            with pytest.raises(grpc.RpcError) as info:
                target_pb2_grpc.TargetServiceStub(channel).Info(common_pb2.InfoRequest(), timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED  # the internal secret: a second factor
        probe = [sys.executable, "-m", "shared.rpc.health_probe", e.target, TARGET_SERVICE, "--ca", str(roots)]
        out = subprocess.run(probe, capture_output=True, text=True, timeout=30, cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert out.returncode == 1 and "requires a client certificate (mutual TLS)" in out.stderr
        out = subprocess.run([*probe, "--cert", str(internal_cert), "--key", str(internal_key)],
                             capture_output=True, text=True, timeout=30, cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
        assert out.returncode == 0 and out.stdout == "SERVING\n"

        renewed_cert, renewed_key = ca.issue(tmp_path / "renewed")  # the model services' certificate renewed
        replace_files({renewed_cert: internal_cert, renewed_key: internal_key})
        for address in (e.target, e.draft):
            assert _until(lambda: served_certificate(address) == der(renewed_cert)), address
        stack.restart("draft", timeout_s=180)  # a fresh connection from the scheduler meets the renewed certificate
        with Client(e.scheduler, root_certificates=roots, api_key=KEY, timeout=60) as client:
            assert _until(lambda: client.info().draft is not None, 30)
            result = client.generate([2, 7, 1, 8], max_new_tokens=8, speculation=2)
            assert len(result.token_ids) == 8 and result.stats.num_draft_tokens > 0


def test_a_mismatched_key_stops_startup_within_10_s(tiny_pair, tmp_path):
    target_dir, _ = tiny_pair
    cert, _ = self_signed(tmp_path / "one")
    _, other_key = self_signed(tmp_path / "two")
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        with launch(_config(tmp_path, target_model=str(target_dir), draft=False, tls_cert=cert, tls_key=other_key)):
            pass
    assert time.monotonic() - started < 10
    assert str(info.value) == f"TANDEM_TLS_KEY: {other_key} is not the key of the certificate {cert} (TANDEM_TLS_CERT)"


@pytest.mark.parametrize("role", ["scheduler", "target"])
def test_a_service_with_an_unusable_certificate_exits_within_10_s(role, tiny_pair, tmp_path):
    """What compose or Kubernetes sees: the process itself ends with one line naming the file."""
    target_dir, _ = tiny_pair
    ca = TestCA()
    cert, _ = ca.issue(tmp_path / "a")
    _, wrong_key = ca.issue(tmp_path / "b")
    expired_cert, expired_key = ca.issue(tmp_path / "old", days=-1)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TANDEM_MODEL": str(target_dir), "TANDEM_PORT": "0",
           "TANDEM_DEVICE": "cpu", "TANDEM_TARGET_ADDR": "127.0.0.1:9", "TANDEM_DRAFT_ADDR": "none"}
    if role == "scheduler":
        env.update(TANDEM_TLS_CERT=str(cert), TANDEM_TLS_KEY=str(wrong_key))
        command, expected = ["services.scheduler.main"], f"TANDEM_TLS_KEY: {wrong_key} is not the key of the certificate"
    else:
        env.update(TANDEM_INTERNAL_TLS_CERT=str(expired_cert), TANDEM_INTERNAL_TLS_KEY=str(expired_key))
        command, expected = ["services.model_main", "target"], f"the certificate in {expired_cert} expired on"
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", *command], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=60)
    assert time.monotonic() - started < 10
    assert out.returncode == 1 and out.stderr.strip().splitlines()[-1].startswith("cannot start: ")
    assert expected in out.stderr.strip().splitlines()[-1]


def test_a_certificate_for_another_name_fails_the_launch_at_once(tiny_pair, tmp_path):
    """The launcher dials 127.0.0.1: a certificate that names only another host cannot pass its probe."""
    target_dir, _ = tiny_pair
    cert, key = self_signed(tmp_path / "elsewhere", names=("tandem.example.com",))
    with pytest.raises(LaunchError) as info:
        with launch(_config(tmp_path, target_model=str(target_dir), draft=False, tls_cert=cert, tls_key=key)):
            pass
    assert str(info.value).startswith("scheduler: the certificate of 127.0.0.1:")
    assert "does not name the host dialled" in str(info.value) and "must name 127.0.0.1" in str(info.value)
