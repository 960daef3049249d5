"""The scheduler's workers over step streams (TANDEM_WORKER_PROTOCOL=stream; docs/services.md, "Step streams").

    target = StreamTargetWorker("127.0.0.1:50052")   # the same TargetWorker as GrpcTargetWorker
    results = await target.verify(items)            # ONE TargetPlan on the long-lived StepStream
    await target.release(ids)                       # no call: goes with the next plan

Per step each worker gets one message with only what changed: new sequences with their prompt
(once), the trees to verify or the tokens to append and the shapes to draft, and the releases
queued since the last plan (applied first). Numbers travel packed (shared/rpc/packing.py).
Info, Features, ResizeKV, Offload and Reload stay unary (inherited from grpc_workers.py).

Deferred work, and why it keeps the workers' contract (scheduler/workers.py):
- releases wait for the next plan of that worker (idempotent; applied before its prefills), or
  go alone after ``IDLE_FLUSH_S`` when no plan follows, so an idle service frees its KV cache;
- a draft prefill returns at once and travels with the next plan (draft prefills answer nothing);
  a failure then surfaces in that plan, where the loop already treats the draft's state as
  unknown and resynchronises. A release of a sequence whose prefill has not left cancels it.
  Offload and Reload first send what is queued, so they see the state the loop believes in.

A broken stream is a worker failure, with the unary protocol's errors (plan_stream.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc.aio

from services.scheduler.grpc_workers import GrpcDraftWorker, GrpcTargetWorker, WorkerProtocolError, WorkerRpcError
from services.scheduler.plan_stream import PlanStream
from services.scheduler.relay_packing import relay_outcome, relayed_trees
from shared.rpc.relay_pack import pack_relay
from services.scheduler.run_ahead import RunAhead
from shared.rpc.call_details import rewritten_metadata
from shared.rpc.chain_packing import pack_chain_items
from shared.rpc.channel import aio_channel
from shared.engine.features import FeatureBlock
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem
from shared.rpc.convert import (_dtype_from_pb, feature_block_from_pb, feature_block_to_pb, feature_spec_to_pb,
                                logprobs_from_pb)
from shared.rpc.gen.tandem.v1 import draft_pb2, target_pb2
from shared.rpc.packing import (pack_i32, pack_trees, stream_prefill_to_pb, stream_spec_item_to_pb, unpack_accepts,
                                unpack_i32, unpack_trees)  # fmt: skip

log = logging.getLogger(__name__)
IDLE_FLUSH_S = 0.05  # releases wait this long for a plan to ride on before they go alone
DEFER_PREFILL_BYTES = 1 << 20  # a draft prefill bigger than this (features) goes at once, on its own
_NO_TREE = TokenTree()  # a plain decode


class _Releases:
    """Release ids queued for the next plan, with a timer that sends them alone when none comes."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.ids: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task | None = None

    def add(self, seq_ids: list[str]) -> None:
        self.ids.extend(seq_ids)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(IDLE_FLUSH_S, self._due)

    def take(self) -> list[str]:
        ids, self.ids = self.ids, []
        return ids

    def _due(self) -> None:
        self._timer = None
        if self.ids:
            self._task = asyncio.get_running_loop().create_task(self._flush_alone())

    async def _flush_alone(self) -> None:
        if self.worker.busy:  # a plan is on its way: the ids ride on the next one
            self.add([])
            return
        try:  # releases only: a queued draft prefill waits for the plan of its request's step (and its trace)
            await self.worker.flush(releases_only=True)
        except Exception as exc:  # noqa: BLE001 - the ids were put back; the next plan carries them
            log.debug("%s: releases not sent yet (%s)", self.worker.role, exc)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _features_of(blocks, where: str, pushed: bool) -> list[FeatureBlock | None]:
    """The outcome's blocks; pushed ones are positions only (the rows went to the draft)."""
    if not pushed:
        return [feature_block_from_pb(b, where) if b.width else None for b in blocks]
    return [FeatureBlock(b.start, b.num_rows, b.width, _dtype_from_pb(b.dtype, where), b"", pushed=True) if b.width
            else None for b in blocks]  # fmt: skip


class _BareStream:
    """The step stream on a channel of its own, without client interceptors, carrying their metadata itself.

    The stream is opened outside any trace (plan_stream.py) and each plan carries its trace context, so the
    tracing interceptors add nothing to it; the secret's interceptor only adds metadata. An intercepted
    grpc.aio stream costs a request queue and a task switch per message each way, on the scheduler's loop,
    in every step. A worker given a channel (not an address), or interceptors that do more than add
    metadata, keeps the stream on its main channel."""

    def _stream_channel(self, method: str, credentials=None):
        address, interceptors, options = self._dial
        metadata = rewritten_metadata(interceptors, method)
        if not self._owns_channel or metadata is None:
            return self._stub, None, None
        channel = aio_channel(address, tracing=False, credentials=credentials, options=options)
        return self._make_stub(channel), channel, metadata

    def _open_bare(self, method: str, credentials=None) -> PlanStream:
        self._bare_stub, self._bare_channel, self._bare_metadata = self._stream_channel(method, credentials)
        call = lambda: getattr(self._bare_stub, method)(metadata=self._bare_metadata)  # noqa: E731
        return PlanStream(self.role, method, call, self.timeout_s)

    @property
    def renewing(self) -> bool:
        """The step stream waits to move to new credentials: ask no more continuation steps of it."""
        return self.stream.renewing

    async def renew_credentials(self, credentials, grace_s: float = 60.0) -> None:
        """Unary calls move at once (grpc_workers.py); the step stream at its next plan that starts with nothing
        owed (plan_stream.py), on a new channel, the old one closed as it is left."""
        await super().renew_credentials(credentials, grace_s)
        old = self._bare_channel
        self._bare_stub, self._bare_channel, self._bare_metadata = self._stream_channel(self.stream.method,
                                                                                        credentials)  # fmt: skip
        if old is None:  # the stream rides on the main channel: it is to move with it
            self.stream.renew()
        else:
            self._old_channels.add(asyncio.get_running_loop().create_task(_close_when(self.stream.renew(), old)))

    async def _close_bare(self) -> None:
        if self._bare_channel is not None:
            await self._bare_channel.close()


async def _close_when(left: asyncio.Event, channel: grpc.aio.Channel) -> None:
    """Close ``channel`` once the step stream has left it (PlanStream.renew)."""
    try:
        await left.wait()
    finally:
        await channel.close()


class StreamTargetWorker(_BareStream, GrpcTargetWorker):
    """``TargetWorker`` over the target's StepStream; ``step`` runs prefills and verifies in one forward."""

    protocol = "stream"
    push_features_to: str | None = None  # a feature draft's address: the target sends it the rows itself
    pushed_feature_bytes = 0  # what the target reported pushing, all time
    run_ahead: RunAhead | None = None  # decode run-ahead (run_ahead.py): main.py turns it on without a draft
    relay_to: str | None = None  # the draft's address when the target relays to it (services/target/draft_relay.py)
    relay_lookaheads = 0  # relayed trees that were lookaheads (services/draft/relay_lookahead.py), all time

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stream = self._open_bare("StepStream", kwargs.get("credentials"))
        self.releases = _Releases(self)
        self._order = asyncio.Lock()  # run-ahead: a step or a flush reads the plan ahead, and sends, alone

    @property
    def busy(self) -> bool:
        """A call is using the stream, or a continuation step's outcome is owed (a plan sent ahead alone is not: a
        flush reads its outcome first)."""
        return self._order.locked() or self.stream.locked or (self.stream.owes and self.run_ahead is None)

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        return (await self.step(items, []))[0]

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        return (await self.step([], items))[1]

    async def step(
        self, prefills: list[PrefillItem], verifies: list[VerifyItem]
    ) -> tuple[list[PrefillResult], list[AcceptResult]]:
        """Prefills and verifies in one target forward (a mixed batch); with run-ahead, decodes sent ahead."""
        ahead = self.run_ahead
        if ahead is None:
            return await self._step_now(prefills, verifies)
        if ahead.pace is not None:
            ahead.pace.tick(time.perf_counter())
        async with self._order:
            await self._settle(go_on=True)  # the oldest outcome owed (sent ahead last step, or a continuation)
            ahead.drop(p.seq_id for p in prefills)
            hits, misses = ahead.split(verifies)
            if prefills or misses:
                if ahead.sent is not None:  # the stream must owe nothing before a plan of its own
                    await self._settle_all()
                    more, misses = ahead.split(misses)  # their next decodes were in those outcomes
                    rest = [i for i in range(len(verifies)) if i not in hits]
                    hits |= {rest[j]: res for j, res in more.items()}
                results, computed = await self._step_now(prefills, misses) if prefills or misses else ([], [])
            else:
                results, computed = [], []
            accepts = ahead.merge(verifies, hits, computed)
            ids = [v.seq_id for v in verifies] + [r.seq_id for r in results if not r.pending]
            if ids and ahead.sent is None and not ahead.buffered(ids):
                await self._send_ahead(ids)
            return results, accepts

    async def _send_ahead(self, ids: list[str]) -> None:
        """The next plain decode of ``ids`` (and with ``repeat``, the ones after it), sent now; its outcome is read
        at the next step or flush."""
        plan = target_pb2.TargetPlan(verify_ids=ids, trees=pack_trees([_NO_TREE] * len(ids)), repeat=self.run_ahead.most())
        released = self.releases.take()
        plan.releases.extend(released)
        try:
            step = await self.stream.send(plan)
        except WorkerRpcError as exc:  # the stream is dropped: the next step computes them (and reopens it)
            self.releases.ids[:0] = released
            log.debug("target: a plan sent ahead failed (%s)", exc)
            return
        ahead = self.run_ahead
        ahead.sent, ahead.owed, ahead.released = (step, ids, released), plan.repeat, set()
        ahead.num_plans += 1

    async def _settle_all(self) -> None:
        while self.run_ahead is not None and self.run_ahead.sent is not None:
            await self._settle()

    async def _settle(self, go_on: bool = False) -> None:
        """Read the oldest outcome owed (a plan sent ahead, or one of its continuations) into the run-ahead results;
        ``go_on`` (a step's read, not a flush's): the last one owed first asks for more of the same decodes."""
        ahead = self.run_ahead
        if ahead is None or ahead.sent is None:
            return
        (step, ids, released), ahead.sent = ahead.sent, None
        if go_on and not ahead.owed and (repeat := ahead.most()) and not self.releases.ids and not ahead.released \
                and not self.stream.renewing:  # fmt: skip
            try:  # the last one owed, nothing released since: go on with the same decodes (TargetPlan.goes_on)
                await self.stream.go_on(target_pb2.TargetPlan(goes_on=True, repeat=repeat))
                ahead.owed, ahead.num_went_on = repeat + 1, ahead.num_went_on + 1
            except WorkerRpcError as exc:  # the stream is dropped: what is owed fails below, as any read would
                log.debug("target: a plan that goes on failed (%s)", exc)
        if ahead.owed:  # a continuation's outcome follows this one
            ahead.owed -= 1
            ahead.sent = (step + 1, ids, [])
        try:
            reply = await self.stream.receive(step, in_band_errors=False)
        except BaseException:
            ahead.sent, ahead.owed = None, 0  # the stream is dropped: nothing more is owed
            self.releases.ids[:0] = released  # not known to be applied: they go again (idempotent)
            raise
        self.grammar_ns += reply.timing.grammar_ns
        if reply.HasField("error"):  # refused, nothing committed: computed when the loop asks for them
            self.releases.ids[:0] = released
            log.info("target: a plan sent ahead was refused (%s); computing it on demand", reply.error.message)
            return
        accepts = unpack_accepts(reply.accepts, [0] * len(ids))
        _attach_logprobs(reply, [], accepts)
        ahead.keep(ids, accepts, set(self.releases.ids))

    async def _step_now(
        self, prefills: list[PrefillItem], verifies: list[VerifyItem]
    ) -> tuple[list[PrefillResult], list[AcceptResult]]:
        if verifies and verifies[0].continued:  # a step the target runs by itself (repeat_plan.py): its outcome only
            if prefills:
                raise ValueError("a continuation step has no prefills")
            flagged, handing = any(i.relay for i in verifies), any(i.handoff is not None for i in verifies)
            if verifies[0].repeat:  # and the steps after the last one owed (TargetPlan.goes_on)
                await self.stream.go_on(target_pb2.TargetPlan(goes_on=True, repeat=verifies[0].repeat - 1))
            reply = await self.stream.receive_continuation()
            self.grammar_ns += reply.timing.grammar_ns
        else:
            plan = target_pb2.TargetPlan(prefills=[stream_prefill_to_pb(i) for i in prefills],
                                         verify_ids=[i.seq_id for i in verifies], repeat=verifies[0].repeat if verifies else 0,
                                         trees=pack_trees([i.tree for i in verifies]))  # fmt: skip
            if self.feature_spec is not None:
                plan.features.CopyFrom(feature_spec_to_pb(self.feature_spec))
                if self.push_features_to:
                    plan.push_features_to = self.push_features_to
            if self.relay_to:
                pack_relay(plan, verifies, self.relay_to)
            flagged, handing = bool(plan.relay_flags), plan.HasField("relay")
            reply = await self._send(plan)
        self.pushed_feature_bytes += reply.pushed_feature_bytes
        first = unpack_i32(reply.first_tokens, "first_tokens")
        if len(first) != len(prefills):
            raise WorkerProtocolError(f"target StepStream: {len(first)} first tokens for {len(prefills)} prefills")
        relayed = relayed_trees(reply, verifies) if flagged else None
        sizes = [len(relayed.get(k, i.tree)) if relayed else len(i.tree) for k, i in enumerate(verifies)]
        accepts = unpack_accepts(reply.accepts, sizes) if verifies else []
        if flagged or handing:
            relay_outcome(reply, verifies, accepts, relayed or {})
            self.relay_lookaheads += reply.relay_lookaheads
        if self.feature_spec is not None:
            if len(reply.features) != len(prefills) + len(verifies):
                raise WorkerProtocolError(f"target StepStream: {len(reply.features)} feature blocks for "
                                          f"{len(prefills) + len(verifies)} sequences")  # fmt: skip
            blocks = _features_of(reply.features, "target step features", reply.features_pushed)
            for res, block in zip(accepts, blocks[len(prefills) :]):
                res.features = block
        else:
            blocks = [None] * len(prefills)
        results = [PrefillResult(i.seq_id, tok, blk) for i, tok, blk in zip(prefills, first, blocks)]
        if reply.prefill_pending:  # chunked prefill and prefix-cache counts, one each per prefill
            columns = [unpack_i32(getattr(reply, f), f) for f in ("prefill_pending", "prefill_num_prefilled",
                                                                    "prefill_num_cached")]  # fmt: skip
            if any(len(c) != len(prefills) for c in columns):
                raise WorkerProtocolError(f"target StepStream: prefill counts for {len(prefills)} prefills disagree")
            for res, pending, done, cached in zip(results, *columns):
                res.pending, res.num_prefilled, res.num_cached = bool(pending), done, cached
        _attach_logprobs(reply, results, accepts)
        return results, accepts

    async def release(self, seq_ids: list[str]) -> None:
        if seq_ids:
            self.releases.add(list(seq_ids))
            if self.run_ahead is not None:
                self.run_ahead.drop(seq_ids)
                self.run_ahead.released.update(seq_ids)  # a continuation still owed may decode them once more

    async def flush(self, releases_only: bool = False) -> None:
        """Read a plan sent ahead, then send the queued releases now, alone."""
        async with self._order:
            await self._settle_all()
            if self.releases.ids and not self.stream.owes:  # a continuation step owed: they ride on the next plan
                await self._send(target_pb2.TargetPlan())

    async def _send(self, plan: target_pb2.TargetPlan) -> target_pb2.TargetOutcome:
        ids = self.releases.take()
        plan.releases.extend(ids)
        try:
            reply = await self.stream.exchange(plan)
        except BaseException:
            self.releases.ids[:0] = ids  # not known to be applied: they go again (idempotent)
            raise
        self.grammar_ns += reply.timing.grammar_ns
        return reply

    async def info(self, wait_s: float = 2.0):
        await _flush_quietly(self)  # what Info reports includes the releases queued so far
        return await super().info(wait_s)

    async def close(self) -> None:
        self.releases.cancel()
        try:
            await asyncio.wait_for(self.flush(), 1.0)
        except Exception:  # noqa: BLE001 - best effort: a target that restarts holds nothing anyway
            pass
        await self.stream.close()
        await self._close_bare()
        await super().close()


class StreamDraftWorker(_BareStream, GrpcDraftWorker):
    """``DraftWorker`` over the draft's SpeculateStream; prefills and releases ride on the next plan."""

    protocol = "stream"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stream = self._open_bare("SpeculateStream", kwargs.get("credentials"))
        self.releases = _Releases(self)
        self._prefills: dict[str, PrefillItem] = {}
        self.missing_features: set[str] = set()  # of the last plan: the draft dropped them (pushed rows lost)

    @property
    def busy(self) -> bool:
        return self.stream.busy

    async def prefill(self, items: list[PrefillItem]) -> None:
        for item in items:
            self._prefills[item.seq_id] = item
        size = sum(len(i.features.data) for i in self._prefills.values() if i.features is not None)
        if size > DEFER_PREFILL_BYTES:
            await self.flush()

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        chains = pack_chain_items(items)  # most steps: columns for the whole batch (chain_packing.py)
        plan = draft_pb2.DraftPlan(chains=chains) if chains is not None else draft_pb2.DraftPlan(
            items=[stream_spec_item_to_pb(i) for i in items])  # fmt: skip
        # a release queued for a sequence this plan speculates waits for the next plan: the draft applies a plan's
        # releases first, and the sequence must still be there for its speculate (draft_ahead.py sends ahead)
        # (a release followed by a prefill of the same id is a resync: it goes first, as the draft applies them)
        held = {i.seq_id for i in items}.intersection(self.releases.ids).difference(self._prefills) \
            if self.releases.ids else ()  # fmt: skip
        reply = await self._send(plan, hold=held)
        self.missing_features = set(reply.missing_features)
        return unpack_trees(reply.trees, len(items), relay=True)

    async def release(self, seq_ids: list[str]) -> None:
        if seq_ids:
            for seq_id in seq_ids:
                self._prefills.pop(seq_id, None)
            self.releases.add(list(seq_ids))

    async def flush(self, releases_only: bool = False) -> None:
        """Send the queued releases and prefills now (``releases_only``: the releases), without speculating."""
        if self.releases.ids or (self._prefills and not releases_only):
            await self._send(draft_pb2.DraftPlan(), with_prefills=not releases_only)

    async def offload(self) -> int:
        await self.flush()
        return await super().offload()

    async def reload(self) -> int:
        await self.flush()
        return await super().reload()

    async def _send(self, plan: draft_pb2.DraftPlan, with_prefills: bool = True, hold=()) -> draft_pb2.DraftOutcome:
        ids = self.releases.take()
        if hold:
            ids, later = [i for i in ids if i not in hold], [i for i in ids if i in hold]
            self.releases.add(later)  # the next plan (or the idle timer) carries them
        plan.releases.extend(ids)
        prefills = list(self._prefills.values()) if with_prefills else []
        if with_prefills:
            self._prefills = {}
        for p in prefills:
            msg = plan.prefills.add()
            msg.CopyFrom(stream_prefill_to_pb(p))
            msg.features_pushed = p.features is not None and p.features.pushed
        try:
            reply = await self.stream.exchange(plan)
        except BaseException:  # the draft's state is unknown now: the loop resyncs (release + re-prefill) what
            self.releases.ids[:0] = ids  # it tracks; the releases of ended sequences go again
            raise
        self.grammar_ns += reply.timing.grammar_ns
        return reply

    async def info(self, wait_s: float = 2.0):
        await _flush_quietly(self)
        return await super().info(wait_s)

    async def close(self) -> None:
        self.releases.cancel()
        self._prefills.clear()  # never sent: nothing to undo on the draft
        try:  # the releases queued last (the final requests') go before the stream closes, as the target's do
            await asyncio.wait_for(self.flush(), 1.0)
        except Exception:  # noqa: BLE001 - best effort: a draft that restarts holds nothing anyway
            pass
        await self.stream.close()
        await self._close_bare()
        await super().close()


def _attach_logprobs(reply, prefilled: list[PrefillResult], accepts: list[AcceptResult]) -> None:
    """The outcome's per-request logprobs (present only when some sampling asked for them)."""
    for name, results in (("prefill_logprobs", prefilled), ("verify_logprobs", accepts)):
        extras = getattr(reply, name)
        if extras and len(extras) != len(results):
            raise WorkerProtocolError(f"target StepStream: {len(extras)} {name} for {len(results)} sequences")
    for res, msg in zip(prefilled, reply.prefill_logprobs):
        res.logprobs = logprobs_from_pb(msg.logprobs) if msg.HasField("logprobs") else None
        res.prompt_logprobs = [logprobs_from_pb(lp) for lp in msg.prompt_logprobs] or None
    for res, msg in zip(accepts, reply.verify_logprobs):
        res.logprobs = [logprobs_from_pb(lp) for lp in msg.logprobs] or None


async def _flush_quietly(worker) -> None:
    try:
        await worker.flush()
    except Exception as exc:  # noqa: BLE001 - the queued work goes with the next plan; Info says the rest
        log.debug("%s: queued work not sent yet (%s)", worker.role, exc)


def worker_classes(protocol: str) -> tuple[type[GrpcTargetWorker], type[GrpcDraftWorker]]:
    """The target and draft worker classes of TANDEM_WORKER_PROTOCOL (stream or unary)."""
    if protocol == "stream":
        return StreamTargetWorker, StreamDraftWorker
    if protocol == "unary":
        return GrpcTargetWorker, GrpcDraftWorker
    raise ValueError(f"worker protocol {protocol!r}: use stream or unary")
