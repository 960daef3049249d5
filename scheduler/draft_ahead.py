"""Draft run-ahead: the next speculate leaves as soon as the target's outcome is in, before the commit.

    step N:    speculate N ─▶ verify N ─▶ outcome N ─┬─▶ speculate ahead: each request that speculated, from
                                                     │   its committed prefix (accepted tokens + bonus), with
               commit N, stream tokens, observers ◀──┘   this step's shape; the draft drafts while the loop works
    step N+1:  plan ─▶ speculate: a request whose plan asks for what was sent takes the tree drafted ahead;
                       the others are drafted now, as without run-ahead

The draft's step N+1 needs only the tokens the target committed, which the outcome holds, and the
shape the policy will pick, which is most often the last one (always under a fixed policy). So the
draft's call runs beside the scheduler's own per-step work (commit, streaming, observers, planning)
instead of after it, as decode run-ahead does for the target (services/scheduler/run_ahead.py) and
vLLM's async scheduling and SGLang's overlap scheduler do for a whole step. Unlike frontier pipelining
(frontier.py) nothing is optimistic: the draft is given true tokens only, so trees work too.

What the loop sees is unchanged; a tree drafted ahead is the tree the draft would draft at step N+1:
- a hit needs the request still on the draft as the call left it (no failure, drop, resync or
  preemption since), its committed tokens exactly those sent, and the plan's shape equal to the one sent;
- otherwise the draft already holds the sent tokens: the loop counts them as seen, gives back those
  beyond the request's tokens (a stop cut the commit short: ``draft_rollback``), and drafts again from
  the same prefix (the last token re-fed: rollback 1), so a miss costs one draft call, as without run-ahead;
- a failed call is a draft failure at step N+1, with the usual recovery (draft_link.py).

Misses cost draft work, so run-ahead pauses where the plans keep changing (an adaptive policy's
lengths): shared/miss_gate.py. Feature-level drafts (EAGLE) are not sent ahead: their
features for the committed tokens are pushed by the target during the step (feature_relay.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from shared.miss_gate import MissGate
from scheduler.request import Request, RequestState
from scheduler.spec_shape import SpecShape
from scheduler.tree_outcome import tree_ok
from shared.engine.types import AcceptResult, SpecItem, TokenTree


@dataclass
class _Sent:
    req: Request
    shape: SpecShape  # the shape it was sent with
    seen_before: int  # req.draft_seen when it left
    seen_after: int  # tokens of req the draft holds once the call is applied


class DraftAhead:
    def __init__(self, window: int = 64, max_miss: float = 0.25, pause_steps: int = 64,
                 max_pause_steps: int = 4096) -> None:  # fmt: skip
        self.gate = MissGate(window, max_miss, pause_steps, max_pause_steps)
        self._task: asyncio.Task | None = None
        self._sent: list[_Sent] = []
        self._shapes: dict[str, SpecShape] = {}  # the collected trees' shapes, by request id
        self.num_sent = 0  # requests sent ahead, all time

    @property
    def num_hits(self) -> int:
        """Trees drafted ahead that the loop took."""
        return self.gate.num_hits

    @property
    def num_misses(self) -> int:
        """Requests sent ahead whose next plan asked for another shape."""
        return self.gate.num_misses

    @property
    def pending(self) -> bool:
        return self._task is not None

    @property
    def paused(self) -> int:
        """Steps left before requests are sent ahead again (0: sending)."""
        return self.gate.paused

    def start(self, draft, batch: list[Request], shapes: list[SpecShape], results: list[AcceptResult]) -> bool:
        """After a verify, before its commit: send each request that speculated its next speculate; whether a
        call was made. The caller yields once right after, so that the call leaves before the commit runs (a
        release the commit queues for a sequence the call speculates waits for the next plan: stream_workers.py)."""
        if not self.gate.open():
            return False
        sent: list[_Sent] = []
        items: list[SpecItem] = []
        for req, shape, res in zip(batch, shapes, results):
            if not shape.speculates or not req.on_draft or req.draft_rollback or req.state is not RequestState.RUNNING:
                continue
            remaining = req.num_remaining - len(res.tokens)
            shape = shape.capped(max(0, remaining - 1))  # as plan_shapes will cap it near the end
            if not res.tokens or remaining <= 0 or not shape.speculates:
                continue  # it ends with this commit, or will not speculate
            items.append(shape.spec_item(req.id, req.tokens_from(req.draft_seen) + list(res.tokens)))
            sent.append(_Sent(req, shape, req.draft_seen, req.num_tokens + len(res.tokens)))
        if not items:
            return False
        self._sent = sent
        self.num_sent += len(items)
        self._task = asyncio.get_running_loop().create_task(draft.speculate(items), name="draft-ahead")
        return True

    async def collect(self) -> dict[str, TokenTree]:
        """The trees drafted ahead, by request id, once the call is back (it raises what the call raised).

        Every request the draft still holds as the call left it is brought up to date (it holds the sent
        tokens: ``draft_seen``, and ``draft_rollback`` for those a stop cut off); a tree is returned for
        those whose tokens are exactly the ones sent."""
        task, sent, self._task, self._sent = self._task, self._sent, None, []
        self._shapes = {}
        if task is None:
            return {}
        trees = await task
        if len(trees) != len(sent):
            raise RuntimeError(f"draft returned {len(trees)} trees for {len(sent)} requests sent ahead")
        out: dict[str, TokenTree] = {}
        for s, tree in zip(sent, trees):
            req = s.req
            if not req.on_draft or req.draft_seen != s.seen_before or req.draft_rollback:
                continue  # dropped, failed or resynchronised since: what the draft holds is not known
            req.draft_seen = min(s.seen_after, req.num_tokens)
            req.draft_rollback = s.seen_after - req.draft_seen
            if req.num_tokens == s.seen_after:
                out[req.id] = tree
                self._shapes[req.id] = s.shape
        return out

    def fill(self, spec: list[tuple[int, Request, SpecShape]], ahead: dict[str, TokenTree], trees: list[TokenTree]):
        """Put the trees drafted ahead that the plan takes into ``trees`` (malformed ones as empty trees); the
        (index, request, shape) entries of ``spec`` still to draft."""
        rest = []
        for entry in spec:
            i, req, shape = entry
            tree = self.take(req, shape, ahead)
            if tree is None:
                rest.append(entry)
            else:
                trees[i] = tree if tree_ok(tree) else TokenTree()
        return rest

    def take(self, req: Request, shape: SpecShape, ahead: dict[str, TokenTree]) -> TokenTree | None:
        """The tree drafted ahead for ``req`` if the loop's plan is the shape sent; None: the draft drafts
        it now, from the prefix it holds, so the last token is fed again (``draft_rollback`` + 1)."""
        tree = ahead.pop(req.id, None)
        if tree is None:
            return None
        hit = self._shapes.get(req.id) == shape
        self.gate.record(hit)
        if hit:
            return tree
        req.draft_seen -= 1
        req.draft_rollback += 1
        return None

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._task, self._sent = None, []
