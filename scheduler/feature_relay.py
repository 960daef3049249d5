"""Relaying target features to a feature-level (EAGLE-family) draft: the scheduler's side of architecture.md §3.

The target returns the features of the tokens each prefill and verify
committed; the scheduler holds them per request until the next draft call for
that request, which carries them beside the same tokens::

    target.prefill ──features f_0..f_{P-1}──▶ Request.features ──┐ (held while the draft is not asked)
    target.verify  ──features f_{n-1}..──────▶ joined onto it ───┤
                                                                  └──▶ draft.prefill / draft.speculate, then cleared

A draft that holds no state for a request (a restart, an offload, a request
it never saw) is rebuilt from features: those still held from position 0 when
there are any, else the target recomputes them (``TargetWorker.features``).
Held rows are capped per request: past the cap they are dropped and the
request is taken off the draft, to be rebuilt by recomputation if it
speculates again. No torch here: blocks are bytes with positions.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem

DEFAULT_MAX_HELD_ROWS = 4096
DEFAULT_MAX_CALL_BYTES = 16 << 20


@dataclass
class FeatureRelay:
    spec: FeatureSpec
    max_held_rows: int = DEFAULT_MAX_HELD_ROWS
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES  # feature bytes per draft call (the RPC limit is 64 MiB)
    bytes_in: int = 0  # received from the target, all time
    bytes_out: int = 0  # sent to the draft, all time
    recomputed: int = 0  # requests rebuilt from features the target recomputed
    source: object = None  # the draft worker: over step streams it names the sequences whose pushed rows it lacked
    bytes_pushed: int = 0  # went from the target straight to the draft (step streams), all time

    def _count(self, block: FeatureBlock | None) -> None:
        if block is not None:
            self.bytes_in += len(block.data)
            self.bytes_pushed += (block.num_rows - block.inline_rows) * block.row_bytes if block.pushed else 0

    def on_prefill(self, req, res: PrefillResult) -> None:
        """A (re)prefill on the target starts the request's features over, from position 0."""
        req.features = res.features
        self._count(res.features)

    def on_verify(self, req, res: AcceptResult) -> bool:
        """Hold the step's rows; False when the request's held rows passed the cap and were dropped."""
        if res.features is None:
            return True
        self._count(res.features)
        try:
            req.features = FeatureBlock.join([b for b in (req.features, res.features) if b is not None])
        except ValueError:  # a gap: rows the draft would need are gone; rebuild from a recomputation
            req.features = None
            return False
        if req.features is not None and req.features.num_rows > self.max_held_rows:
            req.features = None
            return False
        return True

    async def resync(self, requests, target, draft) -> None:
        """Put requests the draft does not hold back on it: every token but the last, with their features.

        Tokens [a, b) travel with rows [a-1, b-1) (the row of the token before each); the last token and
        its row are left in ``Request.features`` for the speculate call that follows. Prompts whose rows
        exceed ``max_call_bytes`` go in several calls (a prefill, then appends that draft nothing), so no
        message passes the RPC size limit.
        """
        held = {r.id: r.features for r in requests if _covers_from_start(r.features, r.num_tokens - 1)}
        missing = [r.id for r in requests if r.id not in held]
        if missing:
            blocks = await target.features(missing, self.spec)
            held.update(zip(missing, blocks))
            self.recomputed += len(missing)
        plans = []  # (request, tokens, rows, chunk length)
        for r in requests:
            tokens, rows = r.tokens(), held[r.id]
            per_row = max(1, rows.row_bytes)
            plans.append((r, tokens, rows, max(2, self.max_call_bytes // per_row)))
        first = [PrefillItem(r.id, t[: min(n, len(t) - 1)], r.sampling, features=rows.rows(0, min(n, len(t) - 1) - 1))
                 for r, t, rows, n in plans]  # fmt: skip
        for batch in _under(first, self.max_call_bytes, lambda p: len(p.features.data)):
            await draft.prefill(batch)
            self.bytes_out += sum(len(p.features.data) for p in batch)
        done = {r.id: min(n, len(t) - 1) for r, t, rows, n in plans}
        while True:  # appends for prompts longer than one call
            items = []
            for r, t, rows, n in plans:
                a, end = done[r.id], len(t) - 1
                if a < end:
                    b = min(a + n, end)
                    items.append(SpecItem(r.id, t[a:b], features=rows.rows(a - 1, b - 1)))
                    done[r.id] = b
            if not items:
                break
            for batch in _under(items, self.max_call_bytes, lambda i: len(i.features.data)):
                await draft.speculate(batch)
                self.bytes_out += sum(len(i.features.data) for i in batch)
        for r, t, rows, n in plans:
            r.features = rows.rows(len(t) - 2, len(t) - 1)  # goes with the last token in the next speculate

    def sent(self, requests) -> None:
        """The draft took the held rows of ``requests``; those whose pushed rows it lacked it dropped (rebuilt
        from a recomputation when they speculate next, as after a draft restart)."""
        missing = getattr(self.source, "missing_features", ())
        for r in requests:
            if r.features is not None:
                self.bytes_out += len(r.features.data)
            r.features = None
            if r.id in missing:
                r.on_draft = False


def _covers_from_start(block: FeatureBlock | None, num_rows: int) -> bool:
    return block is not None and block.start == 0 and block.end >= num_rows


def _under(items: list, cap: int, size) -> list[list]:
    """Consecutive groups of items whose sizes sum to at most ``cap`` (an item larger than cap goes alone)."""
    groups: list[list] = []
    total = 0
    for item in items:
        if not groups or total + size(item) > cap:
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += size(item)
    return groups
