"""Tandem client SDK: ``Client`` (blocking) and ``AsyncClient`` (asyncio) for the public endpoint.

    from sdk import Client, TandemError

Names are imported lazily, so ``import sdk`` (e.g. by the ``tandem`` CLI)
costs nothing until a client is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Client": "sdk.client",
    "AsyncClient": "sdk.client",
    "TokenStream": "sdk.client",
    "AsyncTokenStream": "sdk.client",
    "GenerateResult": "sdk.client",
    "TokenEvent": "sdk.client",
    "TokenLogprob": "sdk.client",
    "TopLogprob": "sdk.client",
    "FinishReason": "sdk.client",
    "Sampling": "sdk.client",
    "Speculation": "sdk.client",
    "AcceptanceStats": "sdk.client",
    "Timing": "sdk.client",
    "ServerInfo": "sdk.client",
    "ModelInfo": "sdk.client",
    "ChatMessage": "sdk.client",
    "TandemError": "sdk.errors",
    "InvalidRequestError": "sdk.errors",
    "ContextLengthError": "sdk.errors",
    "NotFoundError": "sdk.errors",
    "AlreadyExistsError": "sdk.errors",
    "OverloadedError": "sdk.errors",
    "DeadlineExceededError": "sdk.errors",
    "UnavailableError": "sdk.errors",
    "TlsMismatchError": "sdk.errors",
    "CancelledError": "sdk.errors",
    "UnimplementedError": "sdk.errors",
    "PermissionDeniedError": "sdk.errors",
    "ServerError": "sdk.errors",
    "GenerationError": "sdk.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
