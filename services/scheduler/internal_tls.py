"""The scheduler's side of TLS to the model services follows its files, as the servers' side does.

    task = loop.create_task(follow_client_tls(tls, [target, draft]))   # cancelled when the scheduler stops

Every ``interval_s`` the CA bundle and the client certificate and key (mutual TLS) are stat-ed; after a
change that loads cleanly, each worker moves to a new channel with the new credentials (calls in flight
finish on the old one). A change that does not load (a half-written pair, an expired certificate) is
logged once and the current credentials stay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from scheduler.grpc_workers import _GrpcWorker
from shared.rpc.tls import ClientTls, TlsConfigError, file_signature

log = logging.getLogger(__name__)

INTERVAL_S = 10.0


async def follow_client_tls(tls: ClientTls, workers: Sequence[_GrpcWorker], interval_s: float = INTERVAL_S) -> None:
    files = tls.files()
    seen = file_signature(files)
    while True:
        await asyncio.sleep(interval_s)
        signature = file_signature(files)
        if signature == seen:
            continue
        seen = signature
        try:
            credentials = tls.credentials()
        except TlsConfigError as exc:
            log.warning("keeping the current credentials to the model services: %s", exc)
            continue
        log.info("renewed the TLS credentials to the model services from %s", ", ".join(map(str, files)))
        await asyncio.gather(*(worker.renew_credentials(credentials) for worker in workers))
