"""How the target dials a draft service itself (feature push, draft relay): its secret and, with a CA, TLS."""

from __future__ import annotations

import grpc.aio

from shared.rpc.channel import CLIENT_OPTIONS, aio_channel


def dial_draft(settings, address: str) -> grpc.aio.Channel:
    """A channel to the draft at ``address``, dialled with this service's internal secret and TLS (shared/rpc/tls.py)."""
    secret = settings.secret() if settings is not None else None
    tls = settings.internal_client_tls() if settings is not None else None
    if secret:
        from shared.rpc.shared_secret import secret_client_interceptors

        interceptors = secret_client_interceptors(secret)  # streams: not the unary kind
    else:
        interceptors = []
    options = (*CLIENT_OPTIONS, *(tls.options() if tls is not None else ()))
    return aio_channel(address, tracing=False, interceptors=interceptors, options=options,
                       credentials=tls.credentials() if tls is not None else None)  # fmt: skip


def cannot_dial(settings) -> str | None:
    """Why this target cannot dial a draft (a target serving TLS without a CA to check its certificate); None: it can."""
    if settings is None:
        return None
    try:
        tls = settings.internal_client_tls()
    except Exception as exc:  # noqa: BLE001 - e.g. a server certificate without a CA (TlsConfigError)
        return f"no client TLS to dial the draft ({exc})"
    if tls is None and settings.internal_tls_cert is not None:
        return "this target serves TLS but has no TANDEM_INTERNAL_TLS_CA to dial the draft with"
    return None
