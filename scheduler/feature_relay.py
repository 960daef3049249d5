"""Relaying target features to a feature-level (EAGLE-family) draft: the scheduler's side of DESIGN §3.

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
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult

DEFAULT_MAX_HELD_ROWS = 4096


@dataclass
class FeatureRelay:
    spec: FeatureSpec
    max_held_rows: int = DEFAULT_MAX_HELD_ROWS
    bytes_in: int = 0  # received from the target, all time
    bytes_out: int = 0  # sent to the draft, all time
    recomputed: int = 0  # requests rebuilt from features the target recomputed

    def on_prefill(self, req, res: PrefillResult) -> None:
        """A (re)prefill on the target starts the request's features over, from position 0."""
        req.features = res.features
        self.bytes_in += len(res.features.data) if res.features is not None else 0

    def on_verify(self, req, res: AcceptResult) -> bool:
        """Hold the step's rows; False when the request's held rows passed the cap and were dropped."""
        if res.features is None:
            return True
        self.bytes_in += len(res.features.data)
        try:
            req.features = FeatureBlock.join([b for b in (req.features, res.features) if b is not None])
        except ValueError:  # a gap: rows the draft would need are gone; rebuild from a recomputation
            req.features = None
            return False
        if req.features is not None and req.features.num_rows > self.max_held_rows:
            req.features = None
            return False
        return True

    async def resync_items(self, requests, target) -> list[PrefillItem]:
        """Draft prefills for requests the draft does not hold: every token but the last, with their features."""
        held = {r.id: r.features for r in requests if _covers_from_start(r.features, r.num_tokens - 1)}
        missing = [r.id for r in requests if r.id not in held]
        if missing:
            blocks = await target.features(missing, self.spec)
            held.update(zip(missing, blocks))
            self.recomputed += len(missing)
        items = []
        for r in requests:
            prompt = r.tokens()[:-1]
            block = held[r.id].rows(0, len(prompt)) if held[r.id].end >= len(prompt) else held[r.id]
            items.append(PrefillItem(r.id, prompt, r.sampling, features=block))
            self.bytes_out += len(block.data)
            r.features = None  # these rows go with the prefill; the last token goes in as new_tokens, row included
        return items

    def sent(self, requests) -> None:
        """The draft took the held rows of ``requests``."""
        for r in requests:
            if r.features is not None:
                self.bytes_out += len(r.features.data)
            r.features = None


def _covers_from_start(block: FeatureBlock | None, num_rows: int) -> bool:
    return block is not None and block.start == 0 and block.end >= num_rows
