"""The seed of sample i of an n-sample request, shared by the HTTP API's ``n`` and the SDK's ``Client.samples``.

Sample 0 keeps the request's seed (n = 1 reads as before); sample i > 0 draws with a hash of (seed, i), so one
seed makes all n samples reproducible and no two alike, and the same seed gives the same samples on both APIs.
"""

from __future__ import annotations

import hashlib


def sample_seed(seed: int, index: int) -> int:
    """Sample ``index``'s seed, in [0, 2**63)."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
