"""Draft relay, the loop's side: the target hands each step's tokens to the draft, the draft's trees go back to it.

    step N:    verify N, with a handoff per request that speculates (its tokens the draft lacks, this
               step's shape) ─▶ the target verifies, hands the draft the committed tokens; the draft drafts
               step N+1's tree and answers the target (services/target/draft_relay.py)
    step N+1:  plan ─▶ a request whose plan asks for the shape relayed is verified with "the relayed
               tree" (RELAY_TAKE): no speculate call, no tree through the scheduler; any other
               request with a relay out drops it (RELAY_DROP: a plain decode step this once)

Per speculative step the scheduler then sends one plan and reads one outcome, as for a plain decode,
and the two hops of a speculative step (target -> draft -> target) run beside its own per-step work.
Where the plans keep changing shape (an adaptive policy's lengths), drops cost speculation, so the
relay pauses (shared/miss_gate.py) and requests are drafted through the scheduler meanwhile. A chain is never
dropped: a plan asking for a shorter one verifies the relayed chain cut to its length (a causal draft's
first k tokens are what drafting k draws), one asking for a longer one verifies the chain relayed.

Nothing observable changes: the draft drafts from the true committed tokens (the shape capped near the
end as ``plan_shapes`` caps it), the target verifies losslessly whatever tree it gets, and the loop
records the tree the target verified. Order: the target answers a plan that verifies or releases a
request only once the draft has answered that request's last handoff, so after such an outcome the
loop's own draft stream may speculate, release or prefill it again. A request whose relayed tree never
came (``relay_missed``: the draft lost it, or restarted) ran a plain decode step and is resynchronised
on the draft (draft_link.py), as is every request of a verify that failed.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.miss_gate import MissGate
from scheduler.request import Request, RequestState
from scheduler.spec_shape import SpecShape
from shared.engine.types import RELAY_DROP, RELAY_TAKE, AcceptResult, TokenTree, VerifyItem


@dataclass
class _Relayed:
    req: Request
    shape: SpecShape  # what the draft drafts: the step's shape capped as the target capped it
    seen_before: int  # req.draft_seen when the handoff was asked for
    seen_after: int  # tokens of req the draft holds once the handoff is applied


class DraftRelay:
    def __init__(self, gate: MissGate | None = None) -> None:
        self.gate = gate or MissGate()
        self._out: dict[str, _Relayed] = {}  # request id -> its relay out (a tree waiting at the target)
        self.flags: dict[str, int] = {}  # this step's RELAY_TAKE / RELAY_DROP, by request id
        self.cuts: dict[str, int] = {}  # this step's relayed chains to cut to the plan's length, by request id
        self._handoffs: set[str] = set()  # this step's requests asked to hand off
        self.num_relayed = 0  # handoffs made, all time
        self.num_missed = 0  # relayed trees that never came

    def mark(self, batch: list[Request], spec: list[tuple[int, Request, SpecShape]]) -> list[tuple[int, Request, SpecShape]]:
        """Flag each request of ``batch`` with a relay out (take or drop); the ``spec`` entries still to draft now."""
        self.flags, self.cuts = {}, {}
        planned = {req.id: shape for _, req, shape in spec}
        for req in batch:
            out = self._out.pop(req.id, None)
            if out is None:
                continue
            current = self.consume(req, out) and req.num_tokens == out.seen_after
            shape = planned.get(req.id)
            if current and shape == out.shape:
                self.flags[req.id] = RELAY_TAKE
            elif current and shape is not None and shape.kind == out.shape.kind == "chain":
                self.flags[req.id] = RELAY_TAKE  # a chain serves any length: cut when shorter, as relayed when longer
                if shape.k < out.shape.k:
                    self.cuts[req.id] = shape.k
            else:
                self.flags[req.id] = RELAY_DROP
            if shape is not None:  # a relayed tree shorter than the plan, or dropped, counts against the relay
                self.gate.record(self.flags[req.id] == RELAY_TAKE and shape.max_depth <= out.shape.max_depth)
        return [entry for entry in spec if entry[1].id not in self.flags]

    def consume(self, req: Request, out: _Relayed) -> bool:
        """A relay out taken by a verify: whether the draft still holds the request as the handoff left it; if so
        it now holds the handed-off tokens (``draft_rollback``: those a stop cut off the commit)."""
        current = req.on_draft and req.draft_seen == out.seen_before and not req.draft_rollback
        if current:
            req.draft_seen = min(out.seen_after, req.num_tokens)
            req.draft_rollback = out.seen_after - req.draft_seen
        return current

    def out(self, req_id: str) -> _Relayed | None:
        """The relay out of a request (a tree the draft drafts for it), if any."""
        return self._out.get(req_id)

    def pop(self, req_id: str) -> _Relayed | None:
        return self._out.pop(req_id, None)

    def plan(self, batch: list[Request], shapes: list[SpecShape], items: list[VerifyItem], usable: bool) -> None:
        """The verify items' flags, and a handoff for each request that speculates (while the gate is open)."""
        for item in items:
            item.relay, item.relay_cut = self.flags.get(item.seq_id, 0), self.cuts.get(item.seq_id, 0)
        self._handoffs = set()
        self._prune()
        if not usable or not self.gate.open():
            return
        for req, shape, item in zip(batch, shapes, items):
            if not shape.speculates or not req.on_draft or req.draft_rollback or req.state is not RequestState.RUNNING:
                continue
            if item.relay == RELAY_DROP and req.draft_seen != req.num_tokens:
                continue  # its relay was not current: the draft is resynchronised first
            item.handoff = shape.spec_item(req.id, req.tokens_from(req.draft_seen))
            item.remaining = req.num_remaining
            self._handoffs.add(req.id)

    def absorb(self, batch: list[Request], shapes: list[SpecShape], trees: list[TokenTree], results: list[AcceptResult],
               link) -> None:  # fmt: skip
        """After the verify, before the commit: the trees the target verified into ``trees``; missed requests
        resynchronised; the handoffs made recorded."""
        for i, (req, shape, res) in enumerate(zip(batch, shapes, results)):
            if res.relay_tree is not None:
                trees[i] = res.relay_tree
            if res.relay_missed:
                self.num_missed += 1
                link.drop(req)
            elif res.relayed:
                self.num_relayed += 1
                self._out[req.id] = _Relayed(req, shape.capped(req.num_remaining - len(res.tokens) - 1), req.draft_seen,
                                             req.num_tokens + len(res.tokens))  # fmt: skip

    def failed(self, batch: list[Request], link) -> None:
        """A verify failed: what the draft holds of its relayed requests is not known; they are resynchronised."""
        for req in batch:
            if req.id in self.flags or req.id in self._handoffs or self._out.pop(req.id, None) is not None:
                link.drop(req)
        self.flags, self._handoffs = {}, set()

    def _prune(self) -> None:
        """Forget the relays of requests no longer running: one that ended is settled at the target by its release;
        one preempted keeps what the draft holds, its handoff's tokens included (it resumes a step later at least)."""
        stopped = [out for out in self._out.values() if out.req.state is not RequestState.RUNNING]
        for out in stopped:
            del self._out[out.req.id]
            if not out.req.state.done:
                self.consume(out.req, out)
