"""The scheduler's TLS credentials that live outside gRPC's server credentials follow their files too.

    loop.create_task(follow_client_tls(tls, [target, draft]))   # its side of TLS to the model services
    loop.create_task(follow_https(public_tls, uvicorn_config.ssl))   # the HTTP API's certificate

Every ``interval_s`` the files are stat-ed; after a change that loads cleanly, the workers move to a
new channel with the new credentials (calls in flight finish on the old one), or the HTTP API's
SSLContext loads the new certificate (for new connections). A change that does not load (a
half-written pair, an expired certificate) is logged and the current credentials stay.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence

from services.scheduler.grpc_workers import _GrpcWorker
from shared.rpc.tls import ClientTls, ServerTls, TlsConfigError, file_changes

log = logging.getLogger(__name__)

INTERVAL_S = 10.0


async def follow_client_tls(tls: ClientTls, workers: Sequence[_GrpcWorker], interval_s: float = INTERVAL_S) -> None:
    async for _ in file_changes(tls.files(), interval_s):
        try:
            credentials = tls.credentials()
        except TlsConfigError as exc:
            log.warning("keeping the current credentials to the model services: %s", exc)
            continue
        log.info("renewed the TLS credentials to the model services from %s", ", ".join(map(str, tls.files())))
        await asyncio.gather(*(worker.renew_credentials(credentials) for worker in workers))


async def follow_https(tls: ServerTls, context: ssl.SSLContext, interval_s: float = INTERVAL_S) -> None:
    async for _ in file_changes(tls.files(), interval_s):
        try:
            tls.load()  # checked first: load_cert_chain would take an expired certificate
            context.load_cert_chain(str(tls.cert), str(tls.key))
        except (TlsConfigError, ssl.SSLError, OSError) as exc:
            log.warning("keeping the HTTP API's current certificate: %s", exc)
            continue
        log.info("the HTTP API serves the renewed certificate from %s", tls.cert)
