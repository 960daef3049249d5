"""Tandem's service processes: the scheduler service and the model services (target, draft)."""

import logging

from shared.grpc_core import choose_io_path

try:  # before anything imports grpc: gRPC reads its I/O switch once, at import (shared/grpc_core.py)
    choose_io_path()
except ValueError as exc:  # a bad value must not make importing the services fail: gRPC's own path, said loudly
    logging.getLogger(__name__).error("%s; keeping gRPC's default I/O path", exc)
