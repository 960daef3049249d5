"""Certificate and key files are checked before use: each unusable file gets one line naming it."""

from __future__ import annotations

import pytest

from shared.rpc.tls import ClientTls, ServerTls
from shared.rpc.tls_files import TlsConfigError, read_ca, read_pair
from tests.support.certs import TestCA, self_signed


def test_a_good_pair_and_ca_load(tmp_path):
    ca = TestCA()
    cert, key = ca.issue(tmp_path / "server")
    pair = read_pair(cert, key, "TANDEM_TLS")
    assert pair.cert.startswith(b"-----BEGIN CERTIFICATE") and b"PRIVATE KEY" in pair.key
    assert read_ca(ca.write(tmp_path / "ca.crt"), "TANDEM_INTERNAL_TLS_CA").startswith(b"-----BEGIN")


def test_a_key_of_another_certificate_names_both_files(tmp_path):
    cert, _ = self_signed(tmp_path / "one")
    _, other_key = self_signed(tmp_path / "two")
    with pytest.raises(TlsConfigError) as info:
        read_pair(cert, other_key, "TANDEM_TLS")
    assert str(info.value) == (f"TANDEM_TLS_KEY: {other_key} is not the key of the certificate {cert} (TANDEM_TLS_CERT)")


def test_expired_missing_and_non_pem_files(tmp_path):
    ca = TestCA()
    old_cert, old_key = ca.issue(tmp_path / "old", days=-1)
    with pytest.raises(TlsConfigError, match=f"TANDEM_INTERNAL_TLS_CERT: the certificate in {old_cert} expired on"):
        read_pair(old_cert, old_key, "TANDEM_INTERNAL_TLS")
    with pytest.raises(TlsConfigError, match=f"TANDEM_TLS_CERT: cannot read {tmp_path / 'nope.crt'}"):
        read_pair(tmp_path / "nope.crt", old_key, "TANDEM_TLS")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(TlsConfigError, match=f"CA: {tmp_path / 'junk.pem'} is not a PEM file"):
        read_ca(tmp_path / "junk.pem", "CA")
    (tmp_path / "bad.crt").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsConfigError, match="holds no readable certificate"):
        read_pair(tmp_path / "bad.crt", old_key, "TANDEM_TLS")
    cert, _ = ca.issue(tmp_path / "fine")
    with pytest.raises(TlsConfigError, match=f"TANDEM_TLS_KEY: {cert} holds no readable unencrypted private key"):
        read_pair(cert, cert, "TANDEM_TLS")  # the certificate given as its own key


def test_half_configured_tls_is_an_error(tmp_path):
    cert, key = self_signed(tmp_path / "s")
    assert ServerTls.from_files(None, None) is None
    with pytest.raises(TlsConfigError, match="needs both TANDEM_TLS_CERT and TANDEM_TLS_KEY; only TANDEM_TLS_CERT"):
        ServerTls.from_files(cert, None)
    with pytest.raises(TlsConfigError, match="a client certificate needs its key"):
        ClientTls(ca=cert, cert=cert)


def test_settings_name_the_variables(tmp_path):
    from services.settings import ServiceSettings

    cert, key = self_signed(tmp_path / "s")
    env = {"TANDEM_INTERNAL_TLS_CERT": str(cert)}
    with pytest.raises(TlsConfigError, match="TANDEM_INTERNAL_TLS_KEY"):
        ServiceSettings.from_env(env=env).internal_server_tls()
    with pytest.raises(TlsConfigError, match="without TANDEM_INTERNAL_TLS_CA"):
        ServiceSettings.from_env(env=env).internal_client_tls()
    settings = ServiceSettings.from_env(env={**env, "TANDEM_INTERNAL_TLS_KEY": str(key), "TANDEM_INTERNAL_TLS_CA": str(cert)})
    assert settings.internal_server_tls().mutual  # a model service with a CA requires client certificates
    client = settings.internal_client_tls()
    assert (client.ca, client.cert, client.key) == (cert, cert, key)  # the scheduler presents its certificate
    assert ServiceSettings.from_env(env={}).public_tls() is None and ServiceSettings.from_env(env={}).internal_client_tls() is None
