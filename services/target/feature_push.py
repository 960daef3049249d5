"""The target's feature stream to a feature-level draft: each step's committed rows go straight to the draft.

    scheduler ──TargetPlan(push_features_to=draft)──▶ target ──FeaturePush(seq ids, blocks)──▶ draft
              ◀──TargetOutcome(positions only)────────┘                                       │
    scheduler ──DraftPlan(item: rows [a, b) pushed)─────────────────────────────────────────▶ draft (inbox)

The push is written before the step's outcome is answered, so the rows are on their way to the draft
before the scheduler can ask for them. A push that fails (the draft restarted or is away) drops the
stream and answers the rows inline in the outcome instead: the scheduler relays those as before, and
the draft, missing nothing, needs no resync. Rows lost in flight are what the draft reports missing.
Dialled with the service's own internal secret and, when it has a CA, TLS (shared/rpc/tls.py).

A draft on the same host (its Info's ``shared_memory_host`` is this one's) gets the rows through a
shared-memory ring instead (shared/rpc/shared_rows.py): the push then carries positions only. A push the
ring has no room for (the draft has not read that far) goes inline; a draft that cannot open the ring ends
the stream with FAILED_PRECONDITION and gets its rows over gRPC from then on.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc.aio
from opentelemetry import context as otel_context

from services.target.draft_dial import cannot_dial, dial_draft
from shared.engine.features import FeatureBlock
from shared.rpc.feature_wire import encode_feature_push
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from shared.rpc.shared_rows import RowRing, host_id

PUSH_METHOD = "/tandem.v1.DraftService/PushFeatures"

log = logging.getLogger(__name__)
ASK_AGAIN_S = 5.0  # how long a draft whose Info failed gets its rows over gRPC before it is asked again


class FeaturePusher:
    def __init__(self, settings) -> None:
        self.settings = settings
        self.address: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._call = None
        self.bytes_pushed = 0
        self.bytes_shared = 0  # of which through the shared-memory ring (same host)
        self.disabled = cannot_dial(settings)  # why this target cannot dial a draft (rows then go inline)
        if self.disabled:
            log.info("features go through the scheduler: %s", self.disabled)
        self.shared_memory = getattr(settings, "feature_shared_memory", True)
        self._ring: RowRing | None = None  # rows to a draft on this host (shared_rows.py)
        self._shares: dict[str, bool] = {}  # draft address -> whether it shares this host's memory (its Info)
        self._refused: set[str] = set()  # drafts that could not open the ring: over gRPC for good
        self._ask_after: dict[str, float] = {}  # a draft whose Info failed: not asked again before then
        self._writing = asyncio.Lock()  # one push at a time: each scheduler's step stream pushes, and two writes at
        # once on one gRPC call fail it

    def _open(self, address: str):
        if address != self.address:
            self._close_channel()
            self.address = address
        if self._channel is None:
            self._channel = dial_draft(self.settings, address)
        if self._call is None:
            token = otel_context.attach(otel_context.Context())
            try:
                push = self._channel.stream_stream(PUSH_METHOD, request_serializer=None,  # bytes, written already
                                                   response_deserializer=draft_pb2.FeaturePushAck.FromString)
                self._call = push()
            finally:
                otel_context.detach(token)
        return self._call

    async def push(self, address: str, seq_ids: list[str], blocks: list[FeatureBlock]) -> bool:
        """Write one step's rows; False when they could not be sent (then answer them inline)."""
        if not blocks:
            return True
        if self.disabled:
            return False
        async with self._writing:
            return await self._push(address, seq_ids, blocks)

    async def _push(self, address: str, seq_ids: list[str], blocks: list[FeatureBlock]) -> bool:
        size = sum(len(b.data) for b in blocks)
        try:
            call = self._open(address)
            shared = await self._share(address, blocks)
            await call.write(encode_feature_push(seq_ids, blocks, shared))  # rows copied once (feature_wire.py)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError, ConnectionError, RuntimeError) as exc:
            log.warning("feature push to %s failed (%s); this step's rows go through the scheduler", address, exc)
            if self._shares.get(address) and await _refused_shared(self._call):
                log.warning("the draft at %s cannot read this target's shared memory; rows go over gRPC", address)
                self._refused.add(address)  # for good: asked again, it would say the same
            self._shares.pop(address, None)  # a restarted draft may sit elsewhere: asked again
            self._drop()
            return False
        self.bytes_pushed += size
        self.bytes_shared += size if shared is not None else 0
        return True

    async def _share(self, address: str, blocks: list[FeatureBlock]) -> tuple[str, int, list[int]] | None:
        """The ring's name, capacity and the blocks' positions when the rows went into it; None: inline."""
        if not self.shared_memory or address in self._refused:
            return None
        if address not in self._shares:
            now = time.monotonic()
            if now < self._ask_after.get(address, 0.0):
                return None  # its Info failed a moment ago: not asked at every step while it is away
            same = await self._same_host(address)
            if same is None:
                self._ask_after[address] = now + ASK_AGAIN_S
                return None
            self._shares[address] = same
        if not self._shares[address]:
            return None
        if self._ring is None:
            self._ring = RowRing.create()
            log.info("feature rows to the draft at %s through shared memory %s (%d MiB)", address, self._ring.name,
                     self._ring.capacity >> 20)  # fmt: skip
        positions = self._ring.write(blocks)  # None: the draft has not read far enough yet; this push goes inline
        return None if positions is None else (self._ring.name, self._ring.capacity, positions)

    async def _same_host(self, address: str) -> bool | None:
        """Whether the draft's Info names this host's memory (shared_rows.host_id); None when it did not answer."""
        mine = host_id()
        if not mine:
            return False
        try:
            info = await draft_pb2_grpc.DraftServiceStub(self._channel).Info(common_pb2.InfoRequest(), timeout=5.0)
        except grpc.aio.AioRpcError as exc:
            log.info("draft at %s: no Info (%s); feature rows go over gRPC for now", address, exc.code().name)
            return None
        return info.shared_memory_host == mine

    def _drop(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    def _close_channel(self) -> None:
        self._drop()
        channel, self._channel = self._channel, None
        if channel is not None:
            asyncio.get_running_loop().create_task(channel.close())

    def close(self) -> None:
        """At shutdown: the ring goes (a draft still mapping it keeps its pages until it lets go)."""
        if self._ring is not None:
            self._ring.close()
            self._ring = None


async def _refused_shared(call) -> bool:
    """The push stream ended because the draft could not open the ring (FAILED_PRECONDITION)."""
    try:
        return call is not None and call.done() and await call.code() == grpc.StatusCode.FAILED_PRECONDITION
    except Exception:  # noqa: BLE001 - no status to read: not a refusal
        return False
