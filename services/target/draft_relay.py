"""Draft relay, the target's side: a step's committed tokens go straight to the draft, its trees straight back.

    step N:    scheduler ──TargetPlan(verify, relay: seq ids + next shapes)──▶ target: verify N
               target ──RelayHandoff(accepted + bonus tokens, shape)──▶ draft: append, draft N+1 ─┐
               target ──TargetOutcome(relayed ids)──▶ scheduler: commit, stream, plan N+1          │
    step N+1:  scheduler ──TargetPlan(verify: "the relayed tree")──▶ target ◀──RelayTrees─────────┘

A speculative step then crosses two hops one after the other (target -> draft -> target beside target
-> scheduler -> target) instead of four (target -> scheduler -> draft -> scheduler -> target), and the
scheduler moves no tree: per step it sends one plan and reads one outcome, as for a plain decode.

The draft answers every handoff, in order, with one tree per sequence or the sequences it could not
apply (``missing``). A tree a plan asks for waits until its answer is in; one that cannot come (the
stream broke, the draft did not hold the sequence, or nothing came within ``wait_s``) is answered as
missed: that sequence runs a plain decode step and the scheduler resynchronises it on the draft. A
release waits for its sequence's answer first, so once the scheduler has the outcome of a plan that
verified or released a sequence, no handoff of it is still on its way to the draft: the scheduler's own
stream may then prefill or speculate it again without a race.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import grpc.aio
from opentelemetry import context as otel_context

from services.target.draft_dial import cannot_dial, dial_draft
from shared.engine.tree_cut import cut_to_expansion
from shared.engine.types import SpecItem, TokenTree
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.packing import stream_spec_item_to_pb, unpack_trees

RELAY_METHOD = "/tandem.v1.DraftService/Relay"
WAIT_S = 30.0  # the longest a plan waits for a relayed tree (a draft that hangs; a broken stream answers at once)
RETRY_S = 5.0  # after the stream failed (the draft away or unreachable), nothing is relayed for this long

log = logging.getLogger(__name__)


class DraftRelay:
    def __init__(self, settings, wait_s: float = WAIT_S) -> None:
        self.settings = settings
        self.wait_s = wait_s
        self.disabled = cannot_dial(settings)  # why this target cannot dial a draft (then nothing is relayed)
        self.address: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._call = None
        self._reader: asyncio.Task | None = None
        self._step = 0
        self._waiting: dict[int, asyncio.Future] = {}  # this stream's handoffs not answered yet, by number
        self._answers: dict[int, asyncio.Future] = {}  # handoff -> its answer: (trees, missing ids), None if lost
        self._users: dict[int, int] = {}  # handoff -> sequences whose tree is still to be taken from it
        self._where: dict[str, tuple[int, int, tuple]] = {}  # seq id -> (its last handoff, index there, expansion)
        self._unsent: deque[tuple] = deque()  # handoffs made, not written yet, in order
        self._down_until = 0.0  # monotonic time before which nothing is relayed (the stream failed: RETRY_S)
        self.num_handoffs = 0  # sequences handed off, all time
        self.num_missed = 0  # trees asked for that never came

    def handoff(self, address: str, items: list[SpecItem], trace_context=None) -> list[str]:
        """Hand the draft one step's tokens and next shapes; the ids handed off. The message is written by ``flush``,
        which the step stream calls once the step's outcome is on its way to the scheduler (its path is the
        longer one); a write that fails loses the answer, and the trees are missed."""
        if not items or self.disabled or time.monotonic() < self._down_until:
            return []  # the scheduler drafts them itself meanwhile
        self._step = step = self._step + 1
        self._forget([i.seq_id for i in items])  # an answer never asked for (the scheduler moved on): superseded
        self._answers[step] = fut = asyncio.get_running_loop().create_future()  # one per handoff
        self._users[step] = len(items)
        for k, item in enumerate(items):
            self._where[item.seq_id] = (step, k, item.tree_expansion)
        self._unsent.append((address, step, fut, items, trace_context))
        self.num_handoffs += len(items)
        return [i.seq_id for i in items]

    async def flush(self) -> None:
        """Write the handoffs made since the last flush."""
        while self._unsent:
            await self._write(*self._unsent.popleft())

    async def _write(self, address: str, step: int, fut: asyncio.Future, items: list[SpecItem], trace_context) -> None:
        chains = pack_chain_items(items)  # most handoffs: columns for the whole batch
        msg = draft_pb2.RelayHandoff(step=step, chains=chains) if chains is not None else draft_pb2.RelayHandoff(
            step=step, items=[stream_spec_item_to_pb(i) for i in items])  # fmt: skip
        if trace_context:
            msg.trace_context.update(trace_context)
        try:
            call = self._open(address)
            self._waiting[step] = fut
            await call.write(msg)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError, RuntimeError,
                ValueError) as exc:  # fmt: skip
            log.warning("draft relay to %s failed (%s); those sequences are resynchronised, and the scheduler drafts "
                        "for %.0f s", address, exc, RETRY_S)  # fmt: skip
            self._down_until = time.monotonic() + RETRY_S
            self._drop()
            if not fut.done():
                fut.set_result(None)

    async def take(self, seq_ids: list[str]) -> list[TokenTree | None]:
        """The trees the draft drafted from these sequences' last handoffs, once all are answered; None where one
        never came (missed). One wait for the whole plan; none when the answers are in already (the usual case)."""
        await self.flush()  # normally written as the last outcome left
        where = [self._where.get(s) for s in seq_ids]
        await self._wait({at[0] for at in where if at is not None})
        trees = []
        for seq_id, at in zip(seq_ids, where):
            answer = self._answers[at[0]].result() if at is not None and self._answers[at[0]].done() else None
            ok = answer is not None and seq_id not in answer[1] and at[1] < len(answer[0])
            trees.append(cut_to_expansion(answer[0][at[1]], at[2]) if ok else None)  # a beam: SpecInfer's cut
        self._forget(seq_ids)
        self.num_missed += trees.count(None)
        return trees

    async def settle(self, seq_ids) -> None:
        """Wait for the answers of these (released) sequences' handoffs, and forget them."""
        await self.flush()
        await self._wait({at[0] for at in (self._where.get(s) for s in seq_ids) if at is not None})
        self._forget(seq_ids)

    def _forget(self, seq_ids) -> None:
        for seq_id in seq_ids:
            at = self._where.pop(seq_id, None)
            if at is not None:
                left = self._users[at[0]] = self._users[at[0]] - 1
                if left <= 0:
                    del self._users[at[0]], self._answers[at[0]]

    async def _wait(self, steps: set[int]) -> None:
        pending = [f for f in (self._answers[s] for s in steps) if not f.done()]
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=self.wait_s)
        if late:
            log.warning("draft relay: %d answer(s) not in within %.0f s; the stream is dropped and their sequences "
                        "resynchronised", len(late), self.wait_s)  # fmt: skip
            self._drop()

    def _open(self, address: str):
        if address != self.address:
            self._drop()
            channel, self._channel = self._channel, None
            if channel is not None:
                asyncio.get_running_loop().create_task(channel.close())
            self.address = address
        if self._channel is None:
            self._channel = dial_draft(self.settings, address)
        if self._call is None:
            token = otel_context.attach(otel_context.Context())  # the stream outlives any one plan's trace
            try:
                self._call = self._channel.stream_stream(RELAY_METHOD, request_serializer=draft_pb2.RelayHandoff.SerializeToString,
                                                         response_deserializer=draft_pb2.RelayTrees.FromString)()  # fmt: skip
            finally:
                otel_context.detach(token)
            self._waiting = {}  # this stream's own: an older reader that ends fails only what it was to answer
            self._reader = asyncio.get_running_loop().create_task(self._read(self._call, self._waiting),
                                                                  name="draft-relay-reader")  # fmt: skip
        return self._call

    async def _read(self, call, waiting: dict) -> None:
        try:
            async for reply in call:
                fut = waiting.pop(reply.step, None)
                if fut is None or fut.done():
                    continue
                try:
                    fut.set_result((unpack_trees(reply.trees, len(reply.trees.has_probs)), set(reply.missing)))
                except Exception as exc:  # noqa: BLE001 - a malformed answer: its sequences missed
                    log.warning("draft relay: malformed answer to handoff %d (%s)", reply.step, exc)
                    fut.set_result(None)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError) and self._call is call:
                log.warning("draft relay stream ended: %s", exc.code().name)
        finally:
            if self._call is call:  # it ended by itself (not dropped here): the draft is away for now
                self._call, self._down_until = None, time.monotonic() + RETRY_S
            _fail(waiting)

    def _drop(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()
        _fail(self._waiting)

    def close(self) -> None:
        """At shutdown: the stream goes (what was still out is missed)."""
        self._drop()


def _fail(waiting: dict) -> None:
    """A stream is gone: every answer still out on it is lost."""
    futs = list(waiting.values())
    waiting.clear()
    for fut in futs:
        if not fut.done():
            fut.set_result(None)
