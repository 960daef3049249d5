"""gRPC core's I/O path for Tandem's processes, chosen before grpc is first imported.

grpcio 1.80 and later run Python's I/O on gRPC's EventEngine, where reads and writes hop through a
pool of ``event_engine`` threads; the older iomgr path does them on the polling thread. On a 2-core
machine iomgr halved a bare ping-pong, and with the draft relay it made every speculative step and
plain decode at batch 1 shorter (docs/services.md, "Step streams").

``TANDEM_GRPC_IO=iomgr``, the default, turns the EventEngine client, listener and callback queue off
through gRPC's own switch, ``GRPC_EXPERIMENTS`` (unless the environment sets that itself);
``eventengine`` keeps gRPC's choice. gRPC reads the switch once, when it is first imported, so
``services/__init__.py`` applies it before anything imports grpc. Before grpcio 1.80 Python ran on
iomgr anyway and the switch changes nothing.
"""

from __future__ import annotations

import os

IOMGR = "-event_engine_client,-event_engine_listener,-event_engine_callback_cq"
CHOICES = ("eventengine", "iomgr")


def choose_io_path(environ=os.environ) -> str | None:
    """Apply ``TANDEM_GRPC_IO``; the ``GRPC_EXPERIMENTS`` in force (None: gRPC's own). Unknown values raise."""
    choice = environ.get("TANDEM_GRPC_IO", "iomgr").strip().lower() or "iomgr"
    if choice not in CHOICES:
        raise ValueError(f"TANDEM_GRPC_IO must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "iomgr":
        return environ.setdefault("GRPC_EXPERIMENTS", IOMGR)
    return environ.get("GRPC_EXPERIMENTS")
