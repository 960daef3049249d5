"""The scheduler's estimate of what the target's prefix cache holds, so policies charge only uncached prefill.

The target's cache (shared/engine/prefix_cache.py) keys a full block by the hash chain of its prefix; this
mirrors it from what the scheduler itself sent: every full block of every running request's tokens is
recorded under the same key, in an LRU of the target pool's size. A waiting request's estimate
(``Request.num_cached_estimate``) is the run of its leading blocks found here, never its last token's block::

    running A  [k0][k1][k2][·· ]         recorded: k0 k1 k2 (most recent last)
    waiting B  [k0][k1][k7][·· ]         estimate: 2 blocks = 32 tokens (block size 16) not charged

An estimate, not a promise: the target may have evicted blocks the mirror still lists (or block sizes differ),
which costs a policy a worse guess, never a wrong token. LAPS-SD's remaining time (eq. 6's prefill term,
``tokens_to_prefill``) reads it; admission still reserves KV for every token.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.engine.prefix_cache import ROOT, block_key


class PrefixEstimate:
    def __init__(self, block_size: int = 16, capacity_blocks: int = 1 << 14) -> None:
        self.block_size = block_size
        self.capacity = capacity_blocks
        self._keys: OrderedDict[bytes, None] = OrderedDict()
        self._chains: dict[str, list[bytes]] = {}  # request id -> keys of its full blocks recorded so far
        self._estimated: dict[str, int] = {}  # request id -> its length when last estimated

    def observe(self, req) -> None:
        """Record the full blocks of a request the target holds (incremental: only blocks new since last time)."""
        chain = self._chains.setdefault(req.id, [])
        bs = self.block_size
        if len(chain) >= req.num_tokens // bs:  # no block filled since last time (most steps): no token copy
            return
        tokens = req.tokens()
        parent = chain[-1] if chain else ROOT
        for i in range(len(chain), len(tokens) // bs):
            parent = block_key(parent, tokens[i * bs : (i + 1) * bs], req.cache_salt)
            chain.append(parent)
            self._touch(parent)

    def forget(self, req_id: str) -> None:
        self._chains.pop(req_id, None)  # its blocks stay recorded: the target keeps them cached

    def estimate(self, req) -> int:
        """Leading prompt tokens of ``req`` likely cached on the target."""
        tokens, bs = req.tokens(), self.block_size
        parent, hits = ROOT, 0
        for i in range((len(tokens) - 1) // bs):
            parent = block_key(parent, tokens[i * bs : (i + 1) * bs], req.cache_salt)
            if parent not in self._keys:
                break
            hits += 1
        return hits * bs

    def update(self, waiting, running) -> None:
        """Once per step: record what runs, and refresh the waiting requests' estimates."""
        for req in running:
            self.observe(req)
        live = {r.id for r in running}
        for rid in [rid for rid in self._chains if rid not in live]:
            self.forget(rid)
        for req in waiting:  # once per request and length: hashing a long prompt every step would cost too much
            if not req.resident and self._estimated.get(req.id) != req.num_tokens:
                req.num_cached_estimate = self.estimate(req)
                self._estimated[req.id] = req.num_tokens
        if len(self._estimated) > 4 * (len(waiting) + len(live)) + 64:
            keep = {r.id for r in waiting}
            self._estimated = {k: v for k, v in self._estimated.items() if k in keep}

    def _touch(self, key: bytes) -> None:
        self._keys[key] = None
        self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)
