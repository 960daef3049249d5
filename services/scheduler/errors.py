"""Errors the public endpoint raises; each names its gRPC status (``grpc_code``).

The error interceptor (shared.rpc.interceptors) turns them into statuses, so
the servicer holds no try/except. Messages are written for the client: they
say which field is wrong and what would be accepted. They share their root,
``shared.errors.TandemError``, with the engine's errors; each also derives from
the builtin it refines (ValueError, LookupError, RuntimeError).
"""

from __future__ import annotations

from shared.errors import TandemError


class TandemRequestError(TandemError, ValueError):
    """A malformed request (INVALID_ARGUMENT)."""

    grpc_code = "INVALID_ARGUMENT"


class PromptTooLongError(TandemRequestError):
    """Prompt plus max_new_tokens does not fit the target's context window (OUT_OF_RANGE)."""

    grpc_code = "OUT_OF_RANGE"


class NoTokenizerError(TandemRequestError):
    """Text in or out was asked of a server without a tokenizer (FAILED_PRECONDITION)."""

    grpc_code = "FAILED_PRECONDITION"


class DuplicateRequestError(TandemRequestError):
    """A live request already has this id (ALREADY_EXISTS)."""

    grpc_code = "ALREADY_EXISTS"


class UnknownRequestError(TandemError, LookupError):
    """No live or recently finished request has this id (NOT_FOUND)."""

    grpc_code = "NOT_FOUND"


class QueueFullError(TandemError, RuntimeError):
    """The scheduler's queue is at TANDEM_MAX_QUEUE (RESOURCE_EXHAUSTED); retry after ``retry_after_ms``.

    The hint also travels as trailing metadata ``grpc-retry-pushback-ms``, the key gRPC's retry
    machinery reads, so clients with a retry policy back off by it without parsing the message.
    """

    grpc_code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms

    @property
    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("grpc-retry-pushback-ms", str(self.retry_after_ms)),)
