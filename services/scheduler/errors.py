"""Errors the public endpoint raises; each names its gRPC status (``grpc_code``).

The error interceptor (shared.rpc.interceptors) turns them into statuses, so
the servicer holds no try/except. Messages are written for the client: they
say which field is wrong and what would be accepted.
"""

from __future__ import annotations


class TandemRequestError(ValueError):
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


class UnknownRequestError(LookupError):
    """No live or recently finished request has this id (NOT_FOUND)."""

    grpc_code = "NOT_FOUND"
