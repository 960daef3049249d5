"""Tandem's service processes: the scheduler service and the model services (target, draft)."""

from shared.grpc_core import choose_io_path

choose_io_path()  # before anything imports grpc: gRPC reads its I/O switch once, at import (shared/grpc_core.py)
