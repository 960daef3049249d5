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

import grpc.aio
from opentelemetry import context as otel_context

from services.target.draft_dial import cannot_dial, dial_draft
from shared.engine.types import SpecItem, TokenTree
from shared.rpc.gen.tandem.v1 import draft_pb2
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.packing import stream_spec_item_to_pb, unpack_trees

RELAY_METHOD = "/tandem.v1.DraftService/Relay"
WAIT_S = 30.0  # the longest a plan waits for a relayed tree (a draft that hangs; a broken stream answers at once)

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
        self._waiting: dict[int, list[tuple[str, asyncio.Future]]] = {}  # handoff -> its sequences' answers, in order
        self._trees: dict[str, asyncio.Future] = {}  # seq id -> the answer to its last handoff (TokenTree | None)
        self.num_handoffs = 0  # sequences handed off, all time
        self.num_missed = 0  # trees asked for that never came

    async def handoff(self, address: str, items: list[SpecItem], trace_context=None) -> list[str]:
        """Hand the draft one step's tokens and next shapes; the ids sent (none when the stream could not take them)."""
        if not items or self.disabled:
            return []
        self._step += 1
        chains = pack_chain_items(items)  # most handoffs: columns for the whole batch
        msg = draft_pb2.RelayHandoff(step=self._step, chains=chains) if chains is not None else draft_pb2.RelayHandoff(
            step=self._step, items=[stream_spec_item_to_pb(i) for i in items])  # fmt: skip
        if trace_context:
            msg.trace_context.update(trace_context)
        try:
            call = self._open(address)
        except (grpc.aio.UsageError, RuntimeError, ValueError) as exc:
            log.warning("draft relay to %s: cannot open the stream (%s)", address, exc)
            return []
        loop = asyncio.get_running_loop()
        answers = []
        for item in items:
            stale = self._trees.pop(item.seq_id, None)
            if stale is not None and not stale.done():  # never asked for (the scheduler moved on): superseded
                stale.set_result(None)
            self._trees[item.seq_id] = fut = loop.create_future()
            answers.append((item.seq_id, fut))
        self._waiting[self._step] = answers
        try:
            await call.write(msg)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError, RuntimeError) as exc:
            log.warning("draft relay to %s failed (%s); those sequences are drafted through the scheduler", address, exc)
            self._drop()
            for seq_id, _ in answers:
                self._trees.pop(seq_id, None)
            return []
        self.num_handoffs += len(items)
        return [i.seq_id for i in items]

    async def take(self, seq_id: str) -> TokenTree | None:
        """The tree the draft drafted from ``seq_id``'s last handoff, once answered; None: it never came (missed)."""
        fut = self._trees.pop(seq_id, None)
        tree = await self._wait(fut) if fut is not None else None
        if tree is None:
            self.num_missed += 1
        return tree

    async def settle(self, seq_ids) -> None:
        """Wait for the answers of these (released) sequences' handoffs, and forget them."""
        futs = [f for f in (self._trees.pop(s, None) for s in seq_ids) if f is not None]
        if futs:
            await asyncio.gather(*(self._wait(f) for f in futs))

    async def _wait(self, fut: asyncio.Future) -> TokenTree | None:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), self.wait_s)
        except asyncio.TimeoutError:
            log.warning("draft relay: no tree within %.0f s; the stream is dropped and the sequence resynchronised",
                        self.wait_s)  # fmt: skip
            self._drop()
            return None

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
                answers = waiting.pop(reply.step, None)
                if answers is None:
                    continue
                try:
                    trees = unpack_trees(reply.trees, len(answers))
                except Exception as exc:  # noqa: BLE001 - a malformed answer: its sequences missed
                    log.warning("draft relay: malformed answer to handoff %d (%s)", reply.step, exc)
                    trees = [None] * len(answers)
                missing = set(reply.missing)
                for (seq_id, fut), tree in zip(answers, trees):
                    if not fut.done():
                        fut.set_result(None if seq_id in missing else tree)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() != grpc.StatusCode.CANCELLED:
                log.warning("draft relay stream ended: %s", exc.code().name)
        finally:
            if self._call is call:
                self._call = None
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
    """A stream is gone: every answer still out on it is a miss."""
    answers_out = list(waiting.values())
    waiting.clear()
    for answers in answers_out:
        for _, fut in answers:
            if not fut.done():
                fut.set_result(None)

