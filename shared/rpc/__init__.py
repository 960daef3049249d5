"""gRPC plumbing shared by the services, the scheduler and the SDK.

Generated code lives in ``shared.rpc.gen`` (built from ``protos/``, never
committed). Importing this package makes sure it is built and current, so a
fresh clone works without ``make protos``; the check hashes four small files.

    from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc
    from shared.rpc.gen.tandem.v1 import target_pb2, target_pb2_grpc
    from shared.rpc.gen.tandem.v1 import tandem_pb2, tandem_pb2_grpc

Modules: ``build`` (protoc), ``interceptors`` (errors -> status codes, trace
context), ``server`` (aio server + health), ``channel`` (client channels),
``convert`` (protobuf <-> engine dataclasses), ``tls`` (server credentials that
follow their files, client credentials), ``tls_files`` (certificate checks),
``tls_mismatch`` (one-line TLS errors), ``health_probe`` (probes, with TLS).
"""

from __future__ import annotations

from pathlib import Path

from shared.rpc._protoc import GEN_DIR, ProtoBuildError, build


def ensure_built(force: bool = False) -> Path:
    """Build the generated code if it is missing or stale; returns its directory."""
    build(force=force)
    return GEN_DIR


ensure_built()

__all__ = ["GEN_DIR", "ProtoBuildError", "ensure_built"]
