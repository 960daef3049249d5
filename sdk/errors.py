"""Errors the SDK raises: one class per kind of failure, each carrying the server's message.

    try:
        client.generate("...", max_new_tokens=0)
    except InvalidRequestError as e:
        print(e.message)            # "max_new_tokens must be >= 1"

Every error is a ``TandemError`` with ``code`` (the gRPC status name) and
``message`` (the server's details). A request that ran but ended with
FINISH_REASON_ERROR raises ``GenerationError`` with the partial ``result``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from sdk.types import GenerateResult


class TandemError(Exception):
    """Base class. ``code`` is the gRPC status name (e.g. "NOT_FOUND"), or None for client-side errors."""

    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.code else self.message


class InvalidRequestError(TandemError, ValueError):
    """The request was malformed (INVALID_ARGUMENT)."""


class ContextLengthError(InvalidRequestError):
    """Prompt plus generation would not fit the model's context (OUT_OF_RANGE)."""


class NotFoundError(TandemError, KeyError):
    """No such request (NOT_FOUND), e.g. aborting an unknown id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return TandemError.__str__(self)


class AlreadyExistsError(TandemError):
    """A request with this id is already live (ALREADY_EXISTS)."""


class OverloadedError(TandemError):
    """The server has no capacity for the request now (RESOURCE_EXHAUSTED); retry later."""


class DeadlineExceededError(TandemError, TimeoutError):
    """The call's timeout passed before the server answered (DEADLINE_EXCEEDED)."""


class UnavailableError(TandemError, ConnectionError):
    """The server cannot be reached or is shutting down (UNAVAILABLE)."""


class TlsMismatchError(UnavailableError):
    """No connection because of TLS: one side speaks it and the other not, or a certificate is not trusted
    (the message says which; code UNAVAILABLE)."""


class CancelledError(TandemError):
    """The call was cancelled (CANCELLED)."""


class UnimplementedError(TandemError, NotImplementedError):
    """The server does not implement this call (UNIMPLEMENTED)."""


class PermissionDeniedError(TandemError, PermissionError):
    """The caller may not do this (PERMISSION_DENIED / UNAUTHENTICATED)."""


class ServerError(TandemError):
    """The server failed (INTERNAL, UNKNOWN, DATA_LOSS, ...)."""


class GenerationError(TandemError):
    """The request ran but ended with an error; ``result`` holds what was generated before it."""

    def __init__(self, message: str, result: "GenerateResult") -> None:
        super().__init__(message, code="GENERATION_FAILED")
        self.result = result


_BY_CODE: dict[grpc.StatusCode, type[TandemError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.FAILED_PRECONDITION: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: ContextLengthError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExistsError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OverloadedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.CANCELLED: CancelledError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
}


def from_rpc_error(error: grpc.RpcError | Any, target: str | None = None, *, tls_hint: str | None = None) -> TandemError:
    """The TandemError for a failed call (sync ``grpc.RpcError`` or ``grpc.aio.AioRpcError``); ``tls_hint``
    (shared/rpc/tls_mismatch.py: what is wrong with TLS) makes it a TlsMismatchError with that message."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else None) or ""
    cls = _BY_CODE.get(code, ServerError)
    if tls_hint:
        cls, details = TlsMismatchError, tls_hint
    elif code == grpc.StatusCode.UNAVAILABLE and target:
        details = f"cannot reach Tandem at {target}: {details}" if details else f"cannot reach Tandem at {target}"
    exc = cls(details or code.name.lower().replace("_", " "), code=code.name)
    exc.__cause__ = error if isinstance(error, BaseException) else None
    return exc
