"""DraftService over a DraftEngine or a model-free one (NgramDraftEngine, SuffixDraftEngine): protobuf in, one
batched engine call, protobuf out.

Speculate first commits each sequence's ``new_tokens`` (what the target
accepted since the last call), so the draft's KV cache (a model-free draft's
token index or suffix trees) follows the target, then drafts every chain or tree of the batch
in lock-step (one forward per draft step, not per request). As in the target servicer, errors are raised,
never caught: the error interceptor maps them to status codes.

Offload / Reload (Nightjar §5, elastic memory): Offload drops every live
sequence, moves the weights to host memory and frees the KV pool; Prefill and
Speculate then answer FAILED_PRECONDITION until Reload restores the weights
and a fresh pool. Both are idempotent (bytes_moved 0 when there is nothing to
do). The model-free drafts (ngram, suffix) have nothing to offload: UNIMPLEMENTED.
"""

from __future__ import annotations

import grpc.aio

from services.engine_host import EngineHost
from services.draft.feature_inbox import FeatureInbox
from shared.rpc.shared_rows import RingReader
from services.draft.relay_lookahead import Lookaheads
from services.draft.relay_stream import relay_on_engine, run_relay_handoff
from services.draft.spec_stream import run_draft_plan
from services.spans import annotate, event, grammar_cost
from services.stream_writer import StreamWriter
from shared.engine.draft_engine import DraftEngine
from shared.engine.ngram_drafter import NgramDraftEngine
from shared.engine.suffix_drafter import SuffixDraftEngine
from shared.engine.types import ForwardCost, PrefillItem, SpecItem, TokenTree
from shared.rpc.convert import (CallTimer, cost_to_pb, feature_block_from_pb, prefill_item_from_pb, spec_item_from_pb,
                                tree_to_pb)  # fmt: skip
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc

OFFLOAD_UNIMPLEMENTED = "a model-free draft (ngram, suffix) has no weights or KV cache to offload"


class DraftServiceServicer(draft_pb2_grpc.DraftServiceServicer):
    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.engine: DraftEngine | NgramDraftEngine | SuffixDraftEngine = host.engine
        self.inbox = FeatureInbox()  # rows the target pushes (PushFeatures), until a plan takes them
        self.rings = RingReader()  # a target's shared-memory rings, when it runs on this host
        host.closers = [*getattr(host, "closers", ()), self.rings.close]
        host.feature_inbox = self.inbox
        limits = {k: getattr(self.engine, k, None) for k in ("max_chain", "max_depth", "max_width")}
        self.lookahead = Lookaheads(limits)  # the relay's optimistic drafts (relay_lookahead.py), engine thread only
        host.release_hooks.append(self.lookahead.forget)
        host.relay_lookahead = self.lookahead
        host.relay_handler = self.Relay  # also served on the relay socket (relay_socket.py; services/runtime.py)

    async def Prefill(
        self, request: draft_pb2.DraftPrefillRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.DraftPrefillResponse:
        timer = CallTimer()
        items = [prefill_item_from_pb(m) for m in request.items]
        annotate(
            batch_size=len(items),
            prefill_tokens=sum(len(p.prompt_ids) for p in items),
            seq_ids=[p.seq_id for p in items],
            feature_bytes=sum(len(p.features.data) for p in items if p.features is not None),
        )
        ran = await self.host.run(self._prefill, items)
        costs = [cost_to_pb(c) for c in ran.result]
        return draft_pb2.DraftPrefillResponse(
            costs=costs, timing=ran.timing(timer, forward_ns=sum(c.duration_ns for c in costs))
        )

    async def Speculate(
        self, request: draft_pb2.SpeculateRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.SpeculateResponse:
        timer = CallTimer()
        items = [spec_item_from_pb(m) for m in request.items]
        annotate(
            batch_size=len(items),
            new_tokens=sum(len(it.new_tokens) for it in items),
            chain_lens=[it.chain_len for it in items],
            tree_shapes=[f"{it.tree_depth}x{it.tree_width}" for it in items],
            seq_ids=[it.seq_id for it in items],
            feature_bytes=sum(len(it.features.data) for it in items if it.features is not None),
        )
        ran = await self.host.run(self._speculate, items)
        trees, engine_costs = ran.result
        costs = [cost_to_pb(c) for c in engine_costs]
        timing = ran.timing(timer, forward_ns=sum(c.duration_ns for c in costs))
        annotate(drafted_tokens=[len(t) for t in trees], draft_forwards=len(costs), **grammar_cost(self.engine, timing))
        return draft_pb2.SpeculateResponse(
            outputs=[draft_pb2.SpecOutput(seq_id=it.seq_id, tree=tree_to_pb(t)) for it, t in zip(items, trees)],
            costs=costs,
            timing=timing,
        )

    async def SpeculateStream(self, request_iterator, context: grpc.aio.ServicerContext):
        async for plan in request_iterator:  # one plan, one engine call, one outcome (spec_stream.py)
            yield await run_draft_plan(self, plan)

    async def Relay(self, request_iterator, context: grpc.aio.ServicerContext):
        answers = StreamWriter(context, "relay-answers")  # the next handoff is read while an answer leaves
        try:
            async for handoff in request_iterator:  # the target's handoffs: one engine call, one answer each
                answers.put(await run_relay_handoff(self, handoff))  # (relay_stream.py)
        finally:
            await answers.close()

    async def PushFeatures(self, request_iterator, context: grpc.aio.ServicerContext) -> draft_pb2.FeaturePushAck:
        num = 0
        with self.inbox.feed():  # open: a plan waits for rows in flight (feature_inbox.py)
            async for push in request_iterator:  # the target's rows, by sequence and position
                blocks = [feature_block_from_pb(b, f"pushed features of {s!r}", pushed=push.HasField("shared"))
                          for s, b in zip(push.seq_ids, push.blocks)]  # fmt: skip
                if push.HasField("shared"):  # the rows are in the target's ring on this host (shared_rows.py)
                    shared = push.shared
                    try:
                        blocks = self.rings.read(shared.name, shared.capacity, shared.positions, blocks)
                    except (OSError, ValueError) as exc:  # the target sends them over gRPC from now on
                        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"shared feature rows: {exc}")
                for seq_id, block in zip(push.seq_ids, blocks):
                    self.inbox.put(seq_id, block)
                    num += 1
        return draft_pb2.FeaturePushAck(num_blocks=num)

    async def Release(
        self, request: common_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> common_pb2.ReleaseResponse:
        return await self.host.release(request)

    async def Offload(
        self, request: draft_pb2.OffloadRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.OffloadResponse:
        if not isinstance(self.engine, DraftEngine):
            raise NotImplementedError(OFFLOAD_UNIMPLEMENTED)
        timer = CallTimer()
        ran = await self.host.run(self._offload)
        (moved, freed), dropped = ran.result
        annotate(bytes_moved=moved, kv_bytes_freed=freed, num_dropped_seqs=dropped)
        event("draft.offload", bytes_moved=moved, kv_bytes_freed=freed, num_dropped_seqs=dropped)
        return draft_pb2.OffloadResponse(bytes_moved=moved, kv_blocks_free=0, timing=ran.timing(timer))

    async def Reload(
        self, request: draft_pb2.ReloadRequest, context: grpc.aio.ServicerContext
    ) -> draft_pb2.ReloadResponse:
        if not isinstance(self.engine, DraftEngine):
            raise NotImplementedError(OFFLOAD_UNIMPLEMENTED)
        timer = CallTimer()
        ran = await self.host.run(self.engine.reload)
        blocks = self.host.kv_cache.num_free_blocks
        annotate(bytes_moved=ran.result, kv_blocks_free=blocks)
        event("draft.reload", bytes_moved=ran.result, kv_blocks_free=blocks)
        return draft_pb2.ReloadResponse(bytes_moved=ran.result, kv_blocks_free=blocks, timing=ran.timing(timer))

    async def Info(self, request: common_pb2.InfoRequest, context: grpc.aio.ServicerContext) -> common_pb2.ServiceInfo:
        return self.host.info()

    # --- on the engine thread -----------------------------------------------------------------
    def _prefill(self, items: list[PrefillItem]) -> list[ForwardCost]:
        self.lookahead.forget([p.seq_id for p in items])
        self.engine.prefill(items)
        return list(self.engine.costs)

    def _offload(self) -> tuple[tuple[int, int], int]:
        dropped = len(self.engine.runner.seqs)
        self.lookahead.states.clear()
        return self.engine.offload(), dropped

    def _plan(self, releases: list[str], prefills: list[PrefillItem], items: list[SpecItem]):
        """A step stream's plan: releases, prefills, then one speculate; (trees, forward costs)."""
        if releases:
            self.host._release_live(releases)
        costs = self._prefill(prefills) if prefills else []
        trees, spec_costs = self._speculate(items) if items else ([], [])
        return trees, [*costs, *spec_costs]

    def _relay(self, items: list[SpecItem], flags: bytes):
        """A relay handoff (relay_stream.py): ((fresh trees, lookaheads, indices not applied), forward costs)."""
        return relay_on_engine(self, items, flags)

    def _speculate(self, items: list[SpecItem]) -> tuple[list[TokenTree], list[ForwardCost]]:
        self.lookahead.claim(items)  # what a relay drafted optimistically is rolled back first
        trees = self.engine.speculate(items)
        return trees, list(self.engine.costs)
