"""Test certificates made with the ``cryptography`` package: a CA and the leaves it signs, as PEM files.

    ca = TestCA("test-ca")
    cert, key = ca.issue(tmp_path / "server")                 # server.crt, server.key for 127.0.0.1 and localhost
    ca.write(tmp_path / "ca.crt")
    cert, key = ca.issue(tmp_path / "old", days=-1)           # expired yesterday
    cert, key = self_signed(tmp_path / "self")                # its own CA

Leaves carry serverAuth and clientAuth, so one certificate serves and, for mutual TLS, presents.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509", reason="cryptography makes the test certificates")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

NAMES = ("127.0.0.1", "localhost")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sans(names) -> x509.SubjectAlternativeName:
    out = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(out)


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


class TestCA:
    __test__ = False  # not a pytest class

    def __init__(self, common_name: str = "tandem-test-ca") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def write(self, path: Path) -> Path:
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path

    def issue(self, stem: Path, names=NAMES, *, days: int = 7, common_name: str | None = None) -> tuple[Path, Path]:
        """(stem.crt, stem.key): a leaf for ``names``; ``days`` < 0 = expired that many days ago."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        end = now + dt.timedelta(days=days)
        start = end - dt.timedelta(days=2) if days < 0 else now - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder().subject_name(_name(common_name or names[0])).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(_sans(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return cert_path, key_path


def self_signed(stem: Path, names=NAMES) -> tuple[Path, Path]:
    """(stem.crt, stem.key): a self-signed leaf (its own CA), for 127.0.0.1 and localhost."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(_name(names[0])).issuer_name(_name(names[0]))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
        .add_extension(_sans(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def served_certificate(address: str) -> bytes:
    """The DER certificate a TLS server at host:port presents to a new connection (nothing checked)."""
    import socket
    import ssl

    host, port = address.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw, context.wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True)


def der(cert_path: Path) -> bytes:
    import ssl

    return ssl.PEM_cert_to_DER_cert(cert_path.read_text())


def replace_files(pairs: dict[Path, Path]) -> None:
    """Move each source over its destination atomically (how Kubernetes updates a mounted Secret)."""
    import os

    for source, dest in pairs.items():
        tmp = dest.with_name(dest.name + ".new")
        tmp.write_bytes(source.read_bytes())
        os.replace(tmp, dest)
