"""TLS for Tandem's gRPC endpoints: server credentials that follow their files, client credentials.

    server side                                         client side
    ServerTls(cert, key)            TLS                 ClientTls(ca)                 trusts ca (None: system roots)
    ServerTls(cert, key, client_ca) mutual TLS          ClientTls(ca, cert, key)      presents its certificate

    creds = ServerTls(cert, key).credentials()          # checked now (TlsConfigError naming the file)
    server.add_secure_port(address, creds)
    channel = grpc.secure_channel(address, ClientTls(ca).credentials(), options=ClientTls(ca).options())

A server's certificate, key and client CA are re-read when one of the files changes (a new
modification time, size or inode: cert-manager and Kubernetes Secrets replace them in place):
gRPC asks ``CertificateReloader`` before each new connection's handshake, which looks at the
files' stat only and loads them again only after a change. New connections get the new
certificate; established ones keep theirs. Files caught half-written (a key that does not match
the certificate yet) are refused with a warning and the previous certificate stays, until the
next change completes the pair.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from shared.rpc.tls_files import KeyPair, TlsConfigError, read_ca, read_pair

log = logging.getLogger(__name__)

__all__ = ["CertificateReloader", "ClientTls", "ServerTls", "TlsConfigError", "file_changes", "file_signature"]


@dataclass(frozen=True)
class ServerTls:
    """A server's certificate and key; with ``client_ca``, clients must present a certificate it signed."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    what: str = "TANDEM_TLS"  # the settings these files came from, named in errors

    @classmethod
    def from_files(cls, cert: Path | None, key: Path | None, client_ca: Path | None = None,
                   what: str = "TANDEM_TLS") -> ServerTls | None:
        """None when neither file is set (plaintext); TlsConfigError when only one is."""
        if cert is None and key is None:
            return None
        if cert is None or key is None:
            given = "KEY" if cert is None else "CERT"
            raise TlsConfigError(f"TLS needs both {what}_CERT and {what}_KEY; only {what}_{given} is set")
        return cls(cert=Path(cert), key=Path(key), client_ca=client_ca, what=what)

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def load(self) -> tuple[KeyPair, bytes | None]:
        """The checked key pair and client CA; raises TlsConfigError naming the file."""
        pair = read_pair(self.cert, self.key, self.what)
        ca = read_ca(self.client_ca, f"{self.what}_CA") if self.client_ca is not None else None
        return pair, ca

    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert, self.key, self.client_ca) if p is not None)

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials that pick up changed files (see the module's docstring)."""
        reloader = CertificateReloader(self)
        return grpc.dynamic_ssl_server_credentials(
            reloader.initial, reloader, require_client_authentication=self.mutual
        )


def _configuration(pair: KeyPair, ca: bytes | None) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration([(pair.key, pair.cert)], root_certificates=ca)


def file_signature(paths: tuple[Path, ...]) -> tuple:
    """What changes when a file is replaced or rewritten (stat follows Kubernetes' symlinks)."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
        except OSError:
            out.append(None)
    return tuple(out)


async def file_changes(paths: tuple[Path, ...], interval_s: float) -> AsyncIterator[None]:
    """Yields after each change of ``paths`` (``file_signature``), looking every ``interval_s``."""
    seen = file_signature(paths)
    while True:
        await asyncio.sleep(interval_s)
        signature = file_signature(paths)
        if signature != seen:
            seen = signature
            yield None


class CertificateReloader:
    """gRPC's certificate-configuration fetcher: None (keep the current one) unless the files changed
    and load cleanly. Called on gRPC's threads before each handshake; never raises."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._signature = file_signature(tls.files())
        self.initial = _configuration(*tls.load())  # a bad file fails here, at startup
        self.num_reloads = 0
        self.last_error: str | None = None

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            with self._lock:
                signature = file_signature(self.tls.files())
                if signature == self._signature:
                    return None
                self._signature = signature
                try:
                    config = _configuration(*self.tls.load())
                except TlsConfigError as exc:
                    self.last_error = str(exc)
                    log.warning("keeping the current certificate: %s", exc)
                    return None
                self.num_reloads += 1
                self.last_error = None
                log.info("reloaded the TLS certificate from %s", self.tls.cert)
                return config
        except Exception:  # noqa: BLE001 - an exception here would fail the handshake inside gRPC
            log.exception("certificate reload failed; keeping the current certificate")
            return None


@dataclass(frozen=True)
class ClientTls:
    """What a client trusts (``ca``; None = the system's roots) and, for mutual TLS, what it presents.
    ``server_name`` checks the server's certificate for that name instead of the dialled host."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    server_name: str | None = None
    what: str = "TANDEM_INTERNAL_TLS"

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsConfigError(f"{self.what}: a client certificate needs its key and the key its certificate")

    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.ca, self.cert, self.key) if p is not None)

    def credentials(self) -> grpc.ChannelCredentials:
        """Checked now: raises TlsConfigError naming the file."""
        roots = read_ca(self.ca, f"{self.what}_CA") if self.ca is not None else None
        pair = read_pair(self.cert, self.key, self.what) if self.cert is not None else None
        return grpc.ssl_channel_credentials(
            root_certificates=roots,
            private_key=pair.key if pair else None,
            certificate_chain=pair.cert if pair else None,
        )

    def options(self) -> tuple[tuple[str, str], ...]:
        return (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()
