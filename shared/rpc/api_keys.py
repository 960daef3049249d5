"""API keys on the public endpoint (TANDEM_API_KEYS, TANDEM_API_KEYS_FILE).

    client ──[authorization: Bearer <key>]──▶ scheduler's Tandem service
                                              ApiKeyInterceptor: missing or unknown ─▶ UNAUTHENTICATED

Keys come from a comma-separated variable or a file (one per line, ``#`` comments); with none
configured the endpoint is open (the default on loopback). A presented key is compared with every
configured key in constant time (no early exit), a refusal names what was wrong but never the key,
and grpc.health.v1 stays open for orchestrators' probes. The SDK sends ``api_key=`` (or
TANDEM_API_KEY) in this header; the HTTP API (OpenAI-compatible) checks the same keys.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable
from pathlib import Path

from shared.rpc.shared_secret import MetadataGate

log = logging.getLogger(__name__)

HEADER = "authorization"
SCHEME = "Bearer "


def load_keys(value: str | None = None, path: Path | str | None = None) -> frozenset[str]:
    """Keys from a comma-separated value and/or a file (one per line); empty entries are ignored."""
    keys = [k.strip() for k in (value or "").split(",")]
    if path:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
        keys += [line.strip() for line in lines if not line.strip().startswith("#")]
    return frozenset(k for k in keys if k)


def key_matches(presented: str | None, keys: Iterable[str]) -> bool:
    """Constant time in which key matched: every key is compared."""
    if presented is None:
        return False
    p = presented.encode()
    found = False
    for key in keys:
        found |= hmac.compare_digest(p, key.encode())
    return found


def bearer(value: str | bytes | None) -> str | None:
    """The key in an ``Authorization: Bearer <key>`` value (case-insensitive scheme), else None."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not value or not value[: len(SCHEME)].lower() == SCHEME.lower():
        return None
    return value[len(SCHEME) :].strip() or None


class ApiKeyInterceptor(MetadataGate):
    def __init__(self, keys: Iterable[str]) -> None:
        super().__init__()
        self._keys = frozenset(keys)
        if not self._keys:
            raise ValueError("ApiKeyInterceptor needs at least one key")

    def refusal(self, metadata: dict[str, str | bytes]) -> str | None:
        header = metadata.get(HEADER)
        key = bearer(header)
        if key_matches(key, self._keys):
            return None
        what = "missing API key" if header is None else "malformed authorization" if key is None else "invalid API key"
        return f"{what}; send 'authorization: Bearer <key>' (the SDK's api_key=)"
