"""PEM certificates and keys read from files, checked before a server or a client uses them.

    pem = read_pair(Path("tls.crt"), Path("tls.key"), what="TANDEM_TLS")  # KeyPair(cert=b"...", key=b"...")
    roots = read_ca(Path("ca.crt"), what="TANDEM_INTERNAL_TLS_CA")         # bytes

A file that is missing, is not PEM, holds an expired or not yet valid certificate, or a key
that does not belong to its certificate raises ``TlsConfigError`` whose one-line message names
the file and the setting it came from: a service fails at startup instead of serving
handshake failures. The checks use the ``cryptography`` package when it is installed, else the
``ssl`` module (which still catches unreadable files and a key that does not match; expiry is then
left to the peers' handshakes).
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path


class TlsConfigError(ValueError):
    """A certificate, key or CA file is unusable (the message names the file), or the TLS settings of two
    peers do not match (the message names the peer)."""


@dataclass(frozen=True)
class KeyPair:
    cert: bytes  # PEM certificate chain, leaf first
    key: bytes  # PEM private key of the leaf


def read_pem(path: Path, what: str) -> bytes:
    """The file's bytes; TlsConfigError when it cannot be read or holds no PEM block."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsConfigError(f"{what}: {path} is not a PEM file (no -----BEGIN line)")
    return data


def read_ca(path: Path, what: str, *, now: dt.datetime | None = None) -> bytes:
    """A CA bundle: every certificate in it parses and at least one is valid now."""
    data = read_pem(path, what)
    _check_certs(data, path, what, now=now, any_valid=True)
    return data


def read_pair(cert_path: Path, key_path: Path, what: str, *, now: dt.datetime | None = None) -> KeyPair:
    """A certificate chain and its key: both parse, the leaf is valid now, the key is the leaf's."""
    cert, key = read_pem(cert_path, f"{what}_CERT"), read_pem(key_path, f"{what}_KEY")
    _check_certs(cert, cert_path, f"{what}_CERT", now=now, any_valid=False)
    _check_key(cert, key, cert_path, key_path, what)
    return KeyPair(cert=cert, key=key)


def _check_certs(data: bytes, path: Path, what: str, *, now: dt.datetime | None, any_valid: bool) -> None:
    try:
        from cryptography import x509
    except ImportError:  # the ssl module parses them when the context loads them
        return _ssl_check_certs(path, what)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise TlsConfigError(f"{what}: {path} holds no readable certificate ({exc})") from None
    now = now or dt.datetime.now(dt.timezone.utc)
    problems = [_validity_problem(c, now) for c in (certs if any_valid else certs[:1])]
    if any_valid and any(p is None for p in problems) or not any_valid and problems[0] is None:
        return None
    raise TlsConfigError(f"{what}: the certificate in {path} {problems[0]}")


def _validity_problem(cert, now: dt.datetime) -> str | None:
    """Why ``cert`` is not valid at ``now``, or None."""
    if now > cert.not_valid_after_utc:
        return f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC ({cert.subject.rfc4514_string()})"
    if now < cert.not_valid_before_utc:
        return f"is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC ({cert.subject.rfc4514_string()})"
    return None


def _ssl_check_certs(path: Path, what: str) -> None:
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"{what}: {path} holds no readable certificate ({exc})") from None


def _check_key(cert: bytes, key: bytes, cert_path: Path, key_path: Path, what: str) -> None:
    """The key parses and is the private half of the leaf certificate's public key."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        return _ssl_check_key(cert_path, key_path, what)
    try:
        private = serialization.load_pem_private_key(key, password=None)
    except (ValueError, TypeError) as exc:  # TypeError: an encrypted key (no password here)
        raise TlsConfigError(f"{what}_KEY: {key_path} holds no readable unencrypted private key ({exc})") from None
    leaf = x509.load_pem_x509_certificates(cert)[0]
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*der) != leaf.public_key().public_bytes(*der):
        raise TlsConfigError(f"{what}_KEY: {key_path} is not the key of the certificate {cert_path} ({what}_CERT)")
    return None


def _ssl_check_key(cert_path: Path, key_path: Path, what: str) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert_path), str(key_path))
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc):
            raise TlsConfigError(f"{what}_KEY: {key_path} is not the key of the certificate {cert_path} ({what}_CERT)") from None
        raise TlsConfigError(f"{what}: {cert_path} / {key_path} do not load ({exc})") from None
