"""Name what is wrong when a channel cannot connect because of TLS, in one line.

    problem = tls_problem("127.0.0.1:50051", tls=False, details=err.details())
    # "127.0.0.1:50051 speaks TLS but this client dialled it in plaintext: ..."

gRPC reports a plaintext client at a TLS port as UNAVAILABLE "Socket closed", and a TLS client
at a plaintext port or with an untrusted certificate as UNAVAILABLE with OpenSSL's reason deep
in the details. For a plaintext client the port is asked directly: a TLS ClientHello (no
certificate checks, ``timeout_s``) that the server answers as TLS means the port speaks TLS.
"""

from __future__ import annotations

import re
import socket
import ssl

PLAINTEXT_FIX = "dial it without TLS (SDK: no tls= or root_certificates=; CLI: no --tls/--ca)"
TLS_FIX = "use TLS (SDK: root_certificates=CA or tls=True; CLI: --tls --ca CA)"

# OpenSSL reasons in gRPC's details -> what they mean for the user
_TLS_REASONS = (
    ("WRONG_VERSION_NUMBER", "{a} does not speak TLS (plaintext) but this client dialled it with TLS: " + PLAINTEXT_FIX),
    ("CERTIFICATE_REQUIRED", "{a} requires a client certificate (mutual TLS) and this client presented none"),
    ("certificate has expired", "the certificate of {a} has expired"),
    ("CERTIFICATE_VERIFY_FAILED", "the certificate of {a} is not signed by a CA this client trusts "
                                  "(SDK root_certificates=, CLI --ca)"),
    ("not in peer certificate", "the certificate of {a} does not name the host dialled (its subjectAltName)"),
    ("Hostname Verification Check failed", "the certificate of {a} does not name the host dialled (its "
                                           "subjectAltName)"),
    ("TLSV1_ALERT_UNKNOWN_CA", "{a} does not trust this client's certificate (mutual TLS: not signed by its CA)"),
    ("SSLV3_ALERT_BAD_CERTIFICATE", "{a} refused this client's certificate (mutual TLS)"),
    ("Socket closed", "{a} closed the connection in the TLS handshake: it requires a client certificate (mutual "
                      "TLS) that this client did not present, or refused the one it did"),
)
_UNREACHABLE = ("Connection refused", "DNS resolution failed", "No address", "Name or service not known",
                "Network is unreachable", "No route to host")


def tls_problem(address: str, *, tls: bool, details: str, timeout_s: float = 2.0) -> str | None:
    """A one-line description of a TLS mismatch behind a failed connection, or None when it is not one."""
    if tls:
        named = next((text.format(a=address) for reason, text in _TLS_REASONS if reason in details), None)
        if named or any(reason in details for reason in _UNREACHABLE):
            return named
        if speaks_tls(address, timeout_s) is False:  # e.g. a call that waited for ready: no reason in its details
            return _TLS_REASONS[0][1].format(a=address)
        return None
    if any(reason in details for reason in _UNREACHABLE):
        return None
    if speaks_tls(address, timeout_s):
        return f"{address} speaks TLS but this client dialled it in plaintext: {TLS_FIX}"
    return None


def host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of host:port, [v6]:port, ipv4:host:port or dns:///host:port; None for others (unix:)."""
    m = re.fullmatch(r"(?:dns:/*|ipv4:|ipv6:)?\[?([^\[\]/]+?)\]?:(\d+)", address.strip())
    return (m.group(1), int(m.group(2))) if m else None


def speaks_tls(address: str, timeout_s: float = 2.0) -> bool | None:
    """Whether the server at ``address`` answers a TLS ClientHello as TLS (a handshake or a TLS alert);
    None when nothing accepts the connection (or the address is not host:port)."""
    target = host_port(address)
    if target is None:
        return None
    try:
        raw = socket.create_connection(target, timeout=timeout_s)
    except OSError:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only the protocol is in question
    context.set_alpn_protocols(["h2"])
    try:
        with raw, context.wrap_socket(raw, server_hostname=target[0]):
            return True
    except ssl.SSLError as exc:  # a server that sends a TLS alert speaks TLS (e.g. mutual TLS, no client cert)
        return "ALERT" in str(exc).upper()
    except OSError:
        return False
