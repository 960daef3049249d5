"""gRPC core's I/O path for Tandem's processes, chosen before grpc is first imported.

grpcio 1.80 and later run Python's I/O on gRPC's EventEngine, where reads and writes hop through a
pool of ``event_engine`` threads; the older iomgr path does them on the polling thread. Which costs
less depends on the load (docs/services.md, "Step streams"; 2-core Intel Xeon, 2026-12-07):

- one bidirectional ping-pong on loopback (``python -m bench.grpc_floor``, three alternating runs):
  0.25-0.33 ms on the EventEngine, 0.15-0.18 ms on iomgr;
- speculative steps over step streams (``python -m bench.step_overhead``): iomgr faster (a chain of 4
  at batch 8: 1.31 against 1.51 ms), but plain decode with run-ahead slower (batch 64: 1.40 against
  1.07 ms), where the EventEngine's threads move bytes while the loop works.

``TANDEM_GRPC_IO=iomgr`` turns the EventEngine client, listener and callback queue off through gRPC's
own switch, ``GRPC_EXPERIMENTS`` (unless the environment sets that itself); ``eventengine``, the
default, keeps gRPC's choice. gRPC reads the switch once, when it is first imported, so
``services/__init__.py`` applies it before anything imports grpc. Before grpcio 1.80 Python ran on
iomgr anyway and the switch changes nothing.
"""

from __future__ import annotations

import os

IOMGR = "-event_engine_client,-event_engine_listener,-event_engine_callback_cq"
CHOICES = ("eventengine", "iomgr")


def choose_io_path(environ=os.environ) -> str | None:
    """Apply ``TANDEM_GRPC_IO``; the ``GRPC_EXPERIMENTS`` in force (None: gRPC's own). Unknown values raise."""
    choice = environ.get("TANDEM_GRPC_IO", "eventengine").strip().lower() or "eventengine"
    if choice not in CHOICES:
        raise ValueError(f"TANDEM_GRPC_IO must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "iomgr":
        return environ.setdefault("GRPC_EXPERIMENTS", IOMGR)
    return environ.get("GRPC_EXPERIMENTS")
