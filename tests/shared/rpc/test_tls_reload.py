"""A real grpc.aio server with TLS from files: rotated certificates are served to new connections, a
half-written pair keeps the old one, mutual TLS refuses clients without a certificate of its CA, and every
TLS mismatch is named in one line (the probe's stderr, ``tls_problem``)."""

from __future__ import annotations

import time

import pytest

from shared.rpc import health_probe
from shared.rpc.server import add_health, bind, create_server
from shared.rpc.tls import CertificateReloader, ClientTls, ServerTls
from shared.rpc.tls_mismatch import host_port, speaks_tls, tls_problem
from tests.support.certs import TestCA, der, replace_files, served_certificate
from tests.support.loop_thread import LoopThread


async def _serve(tls: ServerTls | None):
    server = create_server()
    await add_health(server, ["test.Svc"])
    port = bind(server, "127.0.0.1:0", tls=tls)
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def loop():
    with LoopThread() as lt:
        yield lt


def _until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_rotation_reaches_new_connections_and_a_half_written_pair_is_refused(loop, tmp_path):
    old_ca, new_ca = TestCA("old-ca"), TestCA("new-ca")
    cert, key = old_ca.issue(tmp_path / "live")
    old_roots, new_roots = old_ca.write(tmp_path / "old-ca.crt"), new_ca.write(tmp_path / "new-ca.crt")
    server, address = loop.run(_serve(ServerTls(cert, key)))
    try:
        assert health_probe.check(address, "test.Svc", tls=ClientTls(ca=old_roots)) == "SERVING"
        assert health_probe.check(address, "test.Svc", tls=ClientTls(ca=new_roots)) == "UNREACHABLE"

        new_cert, new_key = new_ca.issue(tmp_path / "next")
        replace_files({new_cert: cert, new_key: key})  # what cert-manager + a Secret volume do
        assert _until(lambda: served_certificate(address) == der(new_cert))
        assert health_probe.check(address, "test.Svc", tls=ClientTls(ca=new_roots)) == "SERVING"
        assert health_probe.check(address, "test.Svc", tls=ClientTls(ca=old_roots)) == "UNREACHABLE"

        third_cert, third_key = new_ca.issue(tmp_path / "third")
        replace_files({third_cert: cert})  # the key is not there yet: keep serving the last good pair
        time.sleep(0.2)
        assert served_certificate(address) == der(new_cert)
        replace_files({third_key: key})
        assert _until(lambda: served_certificate(address) == der(third_cert))
    finally:
        loop.run(server.stop(0))


def test_the_reloader_keeps_the_good_pair_and_says_why(tmp_path):
    ca = TestCA()
    cert, key = ca.issue(tmp_path / "live")
    reloader = CertificateReloader(ServerTls(cert, key))
    assert reloader() is None  # nothing changed: no reload, no file read
    _, other_key = ca.issue(tmp_path / "other")
    replace_files({other_key: key})
    assert reloader() is None and reloader.num_reloads == 0
    assert f"{key} is not the key of the certificate {cert}" in reloader.last_error
    good_cert, good_key = ca.issue(tmp_path / "good")
    replace_files({good_cert: cert, good_key: key})
    assert reloader() is not None and reloader.num_reloads == 1 and reloader.last_error is None


def test_mutual_tls_and_one_line_mismatch_errors(loop, tmp_path, capsys):
    ca, stranger = TestCA("ca"), TestCA("stranger")
    roots = ca.write(tmp_path / "ca.crt")
    cert, key = ca.issue(tmp_path / "server")
    client_cert, client_key = ca.issue(tmp_path / "client", common_name="scheduler")
    bad_cert, bad_key = stranger.issue(tmp_path / "bad")
    mutual, m_address = loop.run(_serve(ServerTls(cert, key, client_ca=roots)))
    plain, p_address = loop.run(_serve(None))
    try:
        assert health_probe.check(m_address, tls=ClientTls(ca=roots, cert=client_cert, key=client_key)) == "SERVING"
        assert health_probe.check(m_address, tls=ClientTls(ca=roots, cert=bad_cert, key=bad_key)) == "UNREACHABLE"

        cases = [  # probe arguments -> the line on stderr
            ([m_address, "--ca", str(roots)], "requires a client certificate (mutual TLS)"),
            ([m_address], f"{m_address} speaks TLS but this client dialled it in plaintext"),
            ([p_address, "--ca", str(roots)], f"{p_address} does not speak TLS (plaintext)"),
            ([m_address, "--ca", str(stranger.write(tmp_path / "s.crt"))], "is not signed by a CA this client trusts"),
            ([m_address, "--ca", str(roots), "--cert", str(client_cert), "--key", str(client_key),
              "--server-name", "elsewhere.example.com"], "does not name the host dialled"),
            ([m_address, "--ca", str(roots), "--cert", str(client_cert), "--key", str(bad_key)],
             f"probe_KEY: {bad_key} is not the key of the certificate {client_cert}"),
        ]
        for argv, line in cases:
            started = time.monotonic()
            assert health_probe.main(argv) == 1
            out, err = capsys.readouterr()
            assert out == "UNREACHABLE\n" and line in err and err.count("\n") == 1, (argv, err)
            assert time.monotonic() - started < 5
        assert health_probe.main([p_address, "--ca", ""]) == 0  # an empty --ca (compose without TLS): plaintext
        assert health_probe.main([m_address, "--ca", str(roots), "--cert", str(client_cert), "--key", str(client_key),
                                  "--server-name", "localhost"]) == 0
        assert speaks_tls(m_address) and speaks_tls(p_address) is False and speaks_tls("127.0.0.1:9") is None
        from sdk import Client
        from sdk.errors import TlsMismatchError

        started = time.monotonic()
        with Client(p_address, root_certificates=roots) as client, pytest.raises(TlsMismatchError) as info:
            client.health()  # the SDK with TLS at a plaintext port: one line, at once
        assert f"{p_address} does not speak TLS (plaintext)" in str(info.value) and time.monotonic() - started < 5
        assert tls_problem(p_address, tls=False, details="Socket closed") is None  # plaintext both: not a mismatch
    finally:
        loop.run(mutual.stop(0))
        loop.run(plain.stop(0))


def test_addresses_the_probe_understands():
    assert host_port("127.0.0.1:50051") == ("127.0.0.1", 50051)
    assert host_port("[::1]:50051") == ("::1", 50051)
    assert host_port("dns:///scheduler:50051") == ("scheduler", 50051)
    assert host_port("unix:/tmp/sock") is None
