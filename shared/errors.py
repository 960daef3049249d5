"""The root of Tandem's errors: every error a service turns into a status carries its gRPC status name.

    TandemError                         grpc_code, the status the interceptor returns (shared.rpc.interceptors)
    ├── EngineError                     the model runtime (shared/engine/errors.py): bad input, KV pool, loading
    └── request errors                  the public endpoint (services/scheduler/errors.py): a malformed request,
                                        an unknown id, a full queue

One hierarchy, so a handler, the HTTP API (services/scheduler/http_api.py) and the scheduler's failure
handling (scheduler/target_link.py) read one attribute whatever raised it. An engine error that reaches the
scheduler keeps its code on the requests it fails.
"""

from __future__ import annotations


class TandemError(Exception):
    """Base class; ``grpc_code`` names the gRPC status the services return for it."""

    grpc_code = "INTERNAL"
