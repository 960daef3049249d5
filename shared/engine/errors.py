"""Typed engine errors.

Every error the engine raises on bad input derives from ``EngineError`` and
leaves the engine usable: nothing is allocated before validation passes, and
a failed forward releases what it took. The gRPC layer maps each class to a
status code (``grpc_code``) so handlers need no try/except of their own.
The root, shared with the scheduler service's request errors, is
``shared.errors.TandemError``.
"""

from shared.errors import TandemError


class EngineError(TandemError):
    """Base class of the engine's errors; ``grpc_code`` names the gRPC status the services return."""

    grpc_code = "INTERNAL"


class InvalidRequestError(EngineError):
    """Malformed input: empty prompt, token id out of vocabulary, bad sampling values."""

    grpc_code = "INVALID_ARGUMENT"


class InvalidTreeError(InvalidRequestError):
    """A token tree whose parent indices do not describe a tree (cycle, forward or out-of-range parent)."""


class ContextLengthError(InvalidRequestError):
    """The sequence (prompt + generated + speculative tokens) would exceed the model's context window."""

    grpc_code = "OUT_OF_RANGE"


class UnknownSequenceError(EngineError):
    """A sequence id the engine does not hold (never added, or already released)."""

    grpc_code = "NOT_FOUND"


class DuplicateSequenceError(EngineError):
    """A sequence id that is already live."""

    grpc_code = "ALREADY_EXISTS"


class OutOfBlocksError(EngineError):
    """The paged KV cache has too few free blocks for this step; nothing was allocated."""

    grpc_code = "RESOURCE_EXHAUSTED"


class KVBlocksInUseError(EngineError):
    """Shrinking the KV pool would drop blocks that live sequences own; the pool is unchanged."""

    grpc_code = "FAILED_PRECONDITION"


class KVPoolSizeError(InvalidRequestError):
    """A KV pool size outside what the service may hold: [kv_blocks_base, kv_blocks_max] (ResizeKV)."""

    grpc_code = "OUT_OF_RANGE"


class WeightsOffloadedError(EngineError):
    """The draft's weights are in host memory (Offload, Nightjar §5): Reload before Prefill or Speculate."""

    grpc_code = "FAILED_PRECONDITION"


class ModelLoadError(EngineError):
    """A model source that cannot be loaded: missing path, not a model, unsupported file, bad dtype or device.

    Raised before anything is served, so a service fails at start-up with a message that names the path.
    """

    grpc_code = "FAILED_PRECONDITION"
