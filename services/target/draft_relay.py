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

Lookahead (services/draft/relay_lookahead.py): each answer also carries, per sequence, the tree after the
next one, drafted on the optimistic prefix (the next tree's first-child path accepted whole, the bonus
token guessed). When a step commits exactly that prefix, the next verify takes the lookahead at once: the
draft's hop leaves the step's critical path, as frontier pipelining takes it out of the scheduler's. Both
sides decide the take from the same facts, so the handoff is written as soon as its step is done, without
waiting for the last answer; the draft's answer to it says ``taken``, and where that disagrees with the
target (or the answer is lost), the sequence is missed at its next verify and the scheduler resynchronises it.
Where lookaheads stop paying, none are asked for a while: under one in ten taken
(``shared/miss_gate.py``), or steps measured slower per token with them than without at this batch size
(``scheduler/frontier_gate.py``'s gate: where the processes are busy rather than waiting on each other, as
at batch 64 on a 2-core host, the lookahead's extra work costs more than the wait it saves).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import grpc.aio
from opentelemetry import context as otel_context

from services.target.draft_dial import cannot_dial, dial_draft
from services.target.relay_socket import OPEN_S, RelaySocketCall, socket_host
from shared.rpc.socket_tls import client_context
from scheduler.frontier_gate import PIPE, MeasuredGate, MeasuredGateConfig
from services.target.relay_lookahead import (LOOKAHEAD, Ahead, Check, Handed, is_taken, lookahead_gate,
                                             unpack_lookaheads)  # fmt: skip
from shared.engine.spec_cap import shape_key
from shared.engine.tree_cut import cut_to_expansion
from shared.engine.types import SpecItem, TokenTree
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.packing import stream_spec_item_to_pb, unpack_trees

RELAY_METHOD = "/tandem.v1.DraftService/Relay"
INFO_METHOD = "/tandem.v1.DraftService/Info"
WAIT_S = 30.0  # the longest a plan waits for a relayed tree (a draft that hangs; a broken stream answers at once)
RETRY_S = 5.0  # after the stream failed (the draft away or unreachable), nothing is relayed for this long
# lookaheads or not, per shape and batch size: learnt in short runs (P S S P ...), so that both modes see the
# process warm up alike, then compared on the trimmed mean of each mode's last steps (a step counts after two
# choices of its mode), the mode taken kept until the other is clearly faster (on 2 cores: 20 % faster with them
# at batch 1, 10-20 % at 8, 10-40 % slower at 64), and the other judged only on its last exploration run, as it
# ends; neither mode is favoured (margin 0: a lookahead is an option, not a cost model's choice): with the default
# 5 % margin on top of the hysteresis, the lookahead, once taken after a noisy exploration, had to measure 13 % slower
# to be left, and at batch 64 it often costs 10-15 %
RELAY_GATE = MeasuredGateConfig(min_steps=12, run_steps=6, explore_every=200, lag=2, window=24, hysteresis=0.08,
                                margin=0.0, abba=True, fresh=True)  # fmt: skip

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
        self._users: dict[int, int] = {}  # handoff -> references to its answer (_where, _ahead, unwritten)
        self._where: dict[str, tuple[int, int, tuple]] = {}  # seq id -> (its last handoff, index there, expansion)
        self._ahead: dict[str, Ahead] = {}  # seq id -> the answer carrying its lookahead
        self._check: dict[str, Check] = {}  # seq id -> its last handoff may take that lookahead: decided at its take
        self._confirm: dict[str, tuple[int, int, tuple]] = {}  # seq id -> the handoff whose answer must say taken
        self._lost: set[str] = set()  # sequences whose draft state is not what this target took it to be
        self._unsent: deque[tuple] = deque()  # handoffs made, not written yet, in order
        self._writing = asyncio.Lock()  # flush's: one handoff written at a time
        self.lookahead = getattr(settings, "relay_lookahead", "measured")  # measured, always or off
        self.relay_transport = getattr(settings, "relay_transport", "socket")  # the draft's relay socket, or gRPC
        self.transport: str | None = None  # what the open stream runs over: socket or grpc
        self.gate = lookahead_gate()
        self.measured: dict[tuple, MeasuredGate] = {}  # by shape: with lookaheads or without, the faster
        self._asked: MeasuredGate | None = None  # the gate the last handoff asked
        self._last_handoff = 0.0  # perf_counter at the last handoff
        self._typical = 0.0  # a step's time between handoffs, decayed (longer gaps are idle, not counted)
        self.num_taken = 0  # lookaheads taken, all time
        self._down_until = 0.0  # monotonic time before which nothing is relayed (the stream failed: RETRY_S)
        self.num_handoffs = 0  # sequences handed off, all time
        self.num_missed = 0  # trees asked for that never came

    def handoff(self, address: str, items: list[Handed], trace_context=None, tokens: int = 0) -> list[str]:
        """Hand the draft one step's tokens and next shapes (``tokens``: how many the step committed for them); the
        ids handed off. The message is written by ``flush``, which the step stream calls as soon as the step has
        run, before its outcome is packed (step_stream.py); a write that fails loses the answer, and the trees
        are missed."""
        if not items or self.disabled or time.monotonic() < self._down_until:
            return []  # the scheduler drafts them itself meanwhile
        look = self.lookahead == "always" or (self.lookahead == "measured" and self._choose(items, tokens))
        self._step = step = self._step + 1
        for h in items:  # an answer never asked for (the scheduler moved on): superseded
            self._unwhere(h.item.seq_id)
            if (c := self._check.pop(h.item.seq_id, None)) is not None:  # a take never decided: the draft may have
                self._unref(c.ahead.step)  # taken it, so its state is not known
                self._lost.add(h.item.seq_id)
        self._answers[step] = fut = asyncio.get_running_loop().create_future()  # one per handoff
        self._users[step] = 1  # until written
        self._unsent.append((address, step, fut, items, trace_context, look))
        self.num_handoffs += len(items)
        return [h.item.seq_id for h in items]

    def _choose(self, items: list[Handed], tokens: int) -> bool:
        """Whether this handoff asks for lookaheads; the step since the last handoff measured for the gate that chose
        for it. One gate per shape (the first item's): a step's time per token follows its shape (a chain of 4
        commits up to 5 tokens, a 2-2 expansion 3), so modes measured on different shapes do not compare."""
        now = time.perf_counter()
        since, self._last_handoff = now - self._last_handoff, now
        typical = self._typical or since
        if self._asked is not None:
            if since < 0.5 and since < 5 * typical:  # back to back: a step's time (not an idle stretch)
                self._asked.observe(tokens, since)
            else:
                self._asked.ran_serial()
        if since < 0.5:
            self._typical = 0.95 * typical + 0.05 * min(since, 5 * typical)
        key = shape_key(items[0].item)
        gate = self.measured.get(key)
        if gate is None:
            gate = self.measured[key] = MeasuredGate(RELAY_GATE)
        self._asked = gate
        return gate.choose(len(items)) == PIPE and self.gate.open()

    async def flush(self) -> None:
        """Write the handoffs made since the last flush, one writer at a time (each scheduler's step stream flushes;
        two writes at once on one gRPC call fail it), in the order they were made."""
        async with self._writing:
            while self._unsent:
                await self._write(*self._unsent.popleft())

    async def _write(self, address: str, step: int, fut: asyncio.Future, handed: list[Handed], trace_context,
                     look: bool) -> None:  # fmt: skip
        items, flags = self._place(step, handed, look)
        self._unref(step)
        if not items:
            return
        chains = pack_chain_items(items)  # most handoffs: columns for the whole batch
        msg = draft_pb2.RelayHandoff(step=step, chains=chains) if chains is not None else draft_pb2.RelayHandoff(
            step=step, items=[stream_spec_item_to_pb(i) for i in items])  # fmt: skip
        if any(flags):
            msg.lookahead_flags = bytes(flags)
        if trace_context:
            msg.trace_context.update(trace_context)
        try:
            call = await self._open(address)
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
            for item in items:  # the draft never heard this handoff: no lookahead of its last answer is taken
                if (c := self._check.pop(item.seq_id, None)) is not None:
                    self._unref(c.ahead.step)

    def _place(self, step: int, handed: list[Handed], look: bool) -> tuple[list[SpecItem], list[int]]:
        """Where this handoff's trees will be (and its lookaheads), and which sequences' next verifies may take the
        lookahead of their last answer (decided at that take, from that answer: nothing waits here, so the handoff
        leaves as soon as its step is done); (the items to write, their lookahead flags)."""
        items, flags = [], []
        for h in handed:
            item, seq_id = h.item, h.item.seq_id
            a = self._ahead.pop(seq_id, None)
            flag = LOOKAHEAD if look and h.lookahead else 0
            k = len(items)
            if a is not None and flag and h.base is not None:  # the draft takes it where the prefix is the one assumed
                self._check[seq_id] = Check(a, item, h.base, step, k)  # holds a's answer
            elif a is not None:
                self._unref(a.step)
            self._where[seq_id] = (step, k, item.tree_expansion)
            self._users[step] += 1
            if flag:
                self._ahead[seq_id] = Ahead(step, k, item)
                self._users[step] += 1
            items.append(item)
            flags.append(flag)
        return items, flags

    async def take(self, seq_ids: list[str]) -> tuple[list[TokenTree | None], int]:
        """The trees the draft drafted from these sequences' last handoffs, once all are answered (None where one
        never came: missed), and how many were lookaheads. A sequence whose last handoff committed exactly the
        assumed prefix of the lookahead before it takes that lookahead (no wait for the last answer), as the
        draft does on its side; its last answer must then say taken, which the sequence's next take checks."""
        await self.flush()  # normally written as the last outcome left
        await self._confirmed(seq_ids)
        checks = [(s, c) for s in seq_ids if (c := self._check.pop(s, None)) is not None]
        await self._wait({c.ahead.step for _, c in checks})
        took: dict[str, TokenTree] = {}
        for seq_id, c in checks:
            answer = self._answer(c.ahead.step)
            tree = answer[2][c.ahead.index] if answer is not None and seq_id not in answer[1] and \
                c.ahead.index < len(answer[2]) else None  # fmt: skip
            self._unref(c.ahead.step)
            if is_taken(c.item, c.base, tree, c.ahead):
                took[seq_id] = cut_to_expansion(tree.below, c.item.tree_expansion)
            if tree is not None:
                self.gate.record(seq_id in took)
        where = [self._where.get(s) for s in seq_ids]
        await self._wait({at[0] for s, at in zip(seq_ids, where) if at is not None and s not in took})
        trees, looked = [], 0
        for seq_id, at in zip(seq_ids, where):
            if seq_id in self._lost:
                trees.append(None)
            elif seq_id in took:
                trees.append(took[seq_id])
                looked += 1
                if at is not None:  # its answer is checked at the next take; it holds the reference till then
                    self._confirm[seq_id] = self._where.pop(seq_id)
            else:
                answer = self._answer(at[0]) if at is not None else None
                ok = (answer is not None and seq_id not in answer[1] and at[1] < len(answer[0])
                      and not _took(answer, at[1]))  # fmt: skip
                trees.append(cut_to_expansion(answer[0][at[1]], at[2]) if ok else None)  # a beam: SpecInfer's cut
                if not ok and (a := self._ahead.pop(seq_id, None)) is not None:  # that answer's lookahead is lost too
                    self._unref(a.step)
        for seq_id in seq_ids:
            self._unwhere(seq_id)
            self._lost.discard(seq_id)
        self.num_taken += looked
        self.num_missed += trees.count(None)
        return trees, looked

    async def _confirmed(self, seq_ids) -> None:
        """The answers to the handoffs whose lookaheads these sequences took: each must say the draft took it too
        (both decide from the same facts); where one does not, or never came, the sequence is lost (missed next,
        and resynchronised by the scheduler)."""
        confirms = [(s, at) for s in seq_ids if (at := self._confirm.pop(s, None)) is not None]
        if not confirms:
            return
        await self._wait({at[0] for _, at in confirms})
        for seq_id, at in confirms:
            answer = self._answer(at[0])
            if answer is None or seq_id in answer[1] or not _took(answer, at[1]):
                self._lost.add(seq_id)
            self._unref(at[0])

    def _answer(self, step: int):
        """The answer to handoff ``step`` if it came: (trees, missing ids, lookaheads, taken flags); None if lost."""
        fut = self._answers[step]
        return fut.result() if fut.done() else None

    async def settle(self, seq_ids) -> None:
        """Wait for the answers of these (released) sequences' handoffs, and forget them."""
        await self.flush()
        steps = {at[0] for at in (self._where.get(s) for s in seq_ids) if at is not None}
        steps |= {a.step for a in (self._ahead.get(s) for s in seq_ids) if a is not None}
        steps |= {at[0] for at in (self._confirm.get(s) for s in seq_ids) if at is not None}
        await self._wait(steps | {c.ahead.step for c in (self._check.get(s) for s in seq_ids) if c is not None})
        for seq_id in seq_ids:
            self._unwhere(seq_id)
            for held in (self._ahead.pop(seq_id, None), self._check.pop(seq_id, None)):
                if held is not None:
                    self._unref(held.step if isinstance(held, Ahead) else held.ahead.step)
            if (at := self._confirm.pop(seq_id, None)) is not None:
                self._unref(at[0])
            self._lost.discard(seq_id)

    def _unwhere(self, seq_id: str) -> None:
        at = self._where.pop(seq_id, None)
        if at is not None:
            self._unref(at[0])

    def _unref(self, step: int) -> None:
        left = self._users[step] = self._users[step] - 1
        if left <= 0:
            del self._users[step], self._answers[step]

    async def _wait(self, steps: set[int]) -> None:
        pending = [f for f in (self._answers[s] for s in steps) if not f.done()]
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=self.wait_s)
        if late:
            log.warning("draft relay: %d answer(s) not in within %.0f s; the stream is dropped and their sequences "
                        "resynchronised", len(late), self.wait_s)  # fmt: skip
            self._drop()

    async def _open(self, address: str):
        if address != self.address:
            self._drop()
            channel, self._channel = self._channel, None
            if channel is not None:
                asyncio.get_running_loop().create_task(channel.close())
            self.address = address
        if self._channel is None:
            self._channel = dial_draft(self.settings, address)
        if self._call is None:
            call = await self._open_socket(address)  # the draft's relay socket where it serves one (relay_socket.py)
            if call is None:
                token = otel_context.attach(otel_context.Context())  # the stream outlives any one plan's trace
                try:
                    call = self._channel.stream_stream(RELAY_METHOD, request_serializer=draft_pb2.RelayHandoff.SerializeToString,
                                                       response_deserializer=draft_pb2.RelayTrees.FromString)()  # fmt: skip
                finally:
                    otel_context.detach(token)
            self._call = call
            self.transport = "socket" if isinstance(call, RelaySocketCall) else "grpc"
            self._waiting = {}  # this stream's own: an older reader that ends fails only what it was to answer
            self._reader = asyncio.get_running_loop().create_task(self._read(self._call, self._waiting),
                                                                  name="draft-relay-reader")  # fmt: skip
        return self._call

    async def _open_socket(self, address: str) -> RelaySocketCall | None:
        """A connection to the draft's relay socket, asked of its Info at each (re)connection (a restarted draft
        listens on another port), over TLS where this target dials the draft with it; None where the relay stays on gRPC:
        TANDEM_RELAY_TRANSPORT=grpc, a draft that serves no socket, an address a plain socket cannot dial, or a socket
        that does not answer."""
        host = socket_host(address)
        if self.relay_transport != "socket" or host is None:
            return None
        try:
            info = await self._channel.unary_unary(INFO_METHOD, request_serializer=common_pb2.InfoRequest.SerializeToString,
                                                   response_deserializer=common_pb2.ServiceInfo.FromString)(
                common_pb2.InfoRequest(), timeout=OPEN_S)  # fmt: skip
            if not info.relay_port:
                return None
            secret = self.settings.secret() if self.settings is not None else None
            tls = self.settings.internal_client_tls() if self.settings is not None else None
            return await RelaySocketCall.open(host, info.relay_port, secret, ssl=client_context(tls) if tls else None,
                                              server_name=tls.server_name if tls else None)  # fmt: skip
        except (grpc.aio.AioRpcError, OSError, asyncio.TimeoutError) as exc:  # ConnectionError, SSLError: OSErrors
            log.info("draft relay to %s goes over gRPC: its relay socket is not reachable (%s)", address, exc)
            return None

    async def _read(self, call, waiting: dict) -> None:
        try:
            async for reply in call:
                fut = waiting.pop(reply.step, None)
                if fut is None or fut.done():
                    continue
                try:
                    looks = unpack_lookaheads(reply) if reply.HasField("lookaheads") else []
                    fut.set_result((unpack_trees(reply.trees, len(reply.trees.has_probs)), set(reply.missing), looks,
                                    reply.taken))  # fmt: skip
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


def _took(answer, index: int) -> bool:
    """The draft's answer says its item ``index`` took the sequence's last lookahead."""
    taken = answer[3]
    return index < len(taken) and taken[index] == 1


def _fail(waiting: dict) -> None:
    """A stream is gone: every answer still out on it is lost."""
    futs = list(waiting.values())
    waiting.clear()
    for fut in futs:
        if not fut.done():
            fut.set_result(None)
