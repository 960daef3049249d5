"""TLS for a plain socket beside gRPC (the draft's relay socket), from the same files as gRPC's (shared/rpc/tls.py).

    server = ServerSocketTls(ServerTls(cert, key, client_ca))   # mutual with a client CA
    server.refresh()                                            # before each new connection: reload changed files
    loop.create_server(factory, host, port, ssl=server.context)
    ctx = client_context(ClientTls(ca, cert, key))              # trusts ca, presents cert (mutual)

As with gRPC's credentials, a server's certificate and key are read again when their files change
(``file_signature``), checked before each new connection: new connections get the new certificate,
established ones keep theirs, and a pair caught half-written is refused with a warning while the
previous one stays.
"""

from __future__ import annotations

import logging
import ssl

from shared.rpc.tls import ClientTls, ServerTls, file_signature

log = logging.getLogger(__name__)


class ServerSocketTls:
    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        tls.load()  # checked as gRPC's are: TlsConfigError naming the file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.load_cert_chain(tls.cert, tls.key)
        if tls.client_ca is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(cafile=tls.client_ca)
        self._signature = file_signature(tls.files())
        self.num_reloads = 0

    def refresh(self) -> None:
        """Load the files again if they changed since the last look (the context is shared: later handshakes use
        them); keep the current ones if they do not load."""
        signature = file_signature(self.tls.files())
        if signature == self._signature:
            return
        self._signature = signature
        try:
            self.tls.load()
            self.context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.client_ca is not None:
                self.context.load_verify_locations(cafile=self.tls.client_ca)
        except Exception as exc:  # noqa: BLE001 - a half-written pair: the old one serves until the next change
            log.warning("relay socket: keeping the current certificate: %s", exc)
            return
        self.num_reloads += 1


def client_context(tls: ClientTls) -> ssl.SSLContext:
    """A client context that trusts ``tls.ca`` (the system's roots without one) and presents its certificate."""
    context = ssl.create_default_context(cafile=str(tls.ca) if tls.ca is not None else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.cert is not None:
        context.load_cert_chain(tls.cert, tls.key)
    return context
