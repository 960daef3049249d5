"""The scheduler's workers over gRPC: one batched RPC per worker call, trace context attached.

    target = GrpcTargetWorker("127.0.0.1:50052")     # or a grpc.aio channel you own
    results = await target.verify(items)             # ONE Verify RPC for the whole batch
    info = await target.info()                       # tandem.v1.ServiceInfo
    await target.close()

Errors. A failed RPC raises ``WorkerRpcError``: still a grpc.aio.AioRpcError
(``code()``, ``details()``), plus ``grpc_code``, the status name the
scheduler puts on the requests it fails, and a one-line message. A reply that
does not answer the request (other seq ids, another count) raises
``WorkerProtocolError``. The loop treats both like any worker failure: a
failed draft call degrades to plain decoding, a failed target call fails
that call's requests (engine_loop.py, "Failure handling").

Trace context. Channels made here carry the tracing client interceptors, so
the span that is current at the call (the scheduler's speculate or verify
span) parents the service's server span: one trace across processes. A
channel passed in is used as it is.

Deadlines. Every call has one (``timeout_s``), so a hung service costs a
timeout, not a stuck loop; and none waits for a service to come up
(no wait_for_ready): a draft that is down fails fast with UNAVAILABLE and the
loop degrades at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
import grpc.aio

import shared.rpc  # noqa: F401 - builds the generated code if needed
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem
from shared.rpc.channel import CLIENT_OPTIONS, aio_channel
from shared.engine.features import FeatureBlock, FeatureSpec
from shared.rpc.convert import (
    accept_from_pb,
    feature_block_from_pb,
    feature_spec_to_pb,
    prefill_item_to_pb,
    prefill_result_from_pb,
    spec_item_to_pb,
    tree_from_pb,
    verify_item_to_pb,
)
from shared.rpc.gen.tandem.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc

DEFAULT_TIMEOUT_S = 60.0  # one batched call; generous for CPU forwards of long prompts


class WorkerRpcError(grpc.aio.AioRpcError):
    """An RPC to a model service failed; ``grpc_code`` is the status name (e.g. "NOT_FOUND")."""

    def __init__(self, role: str, method: str, err: grpc.aio.AioRpcError) -> None:
        super().__init__(
            err.code(), err.initial_metadata(), err.trailing_metadata(), err.details(), err.debug_error_string()
        )
        self.role, self.method = role, method
        self.grpc_code = err.code().name

    def __str__(self) -> str:
        return f"{self.role} {self.method}: {self.grpc_code}: {self.details()}"


class WorkerProtocolError(RuntimeError):
    """A model service answered, but not what was asked (a buggy or mismatched peer)."""


class _GrpcWorker:
    role = ""

    def __init__(
        self,
        channel_or_address: grpc.aio.Channel | str,
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
        credentials: grpc.ChannelCredentials | None = None,
        channel_options: Sequence[tuple[str, Any]] = (),
    ):
        """``interceptors``, ``credentials`` (TLS) and ``channel_options`` (on top of CLIENT_OPTIONS) apply to a
        channel made here from an address (e.g. the internal secret's, shared/rpc/tls.py's)."""
        self.tls = credentials is not None
        self._dial = (channel_or_address, tuple(interceptors), (*CLIENT_OPTIONS, *channel_options))
        if isinstance(channel_or_address, str):
            channel = aio_channel(channel_or_address, interceptors=interceptors, credentials=credentials,
                                  options=self._dial[2])
            self.channel, self._owns_channel = channel, True
        else:
            self.channel, self._owns_channel = channel_or_address, False
        self.timeout_s = timeout_s
        self._stub = self._make_stub(self.channel)
        self._old_channels: set[asyncio.Task] = set()  # renew_credentials: old channels closing (grace, or once left)

    def _make_stub(self, channel: grpc.aio.Channel) -> Any:
        raise NotImplementedError

    bytes_out = bytes_in = 0  # message bytes sent and received by this worker's unary calls, all time
    grammar_ns = 0  # the service's structured-output grammar time, summed over its replies (metrics)

    async def _call(self, method: str, request: Any) -> Any:
        self.bytes_out += request.ByteSize()
        try:
            reply = await getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.aio.AioRpcError as err:
            raise WorkerRpcError(self.role, method, err) from None
        self.bytes_in += reply.ByteSize()
        timing = getattr(reply, "timing", None)
        if timing is not None:
            self.grammar_ns += timing.grammar_ns
        return reply

    def wire_bytes(self) -> int:
        """Message bytes this worker moved both ways so far (a step stream's plans and outcomes too)."""
        stream = getattr(self, "stream", None)
        return self.bytes_out + self.bytes_in + (stream.bytes_out + stream.bytes_in if stream is not None else 0)

    def _check_ids(self, method: str, asked: Sequence[str], answered: Sequence[str]) -> None:
        if list(asked) != list(answered):
            raise WorkerProtocolError(
                f"{self.role} {method} answered for {len(answered)} sequence(s) {list(answered)[:8]} "
                f"when asked about {len(asked)} {list(asked)[:8]}"
            )

    async def release(self, seq_ids: list[str]) -> None:
        """Idempotent: the services ignore ids they do not hold."""
        if seq_ids:
            await self._call("Release", common_pb2.ReleaseRequest(seq_ids=seq_ids))

    async def info(self, wait_s: float = 2.0) -> common_pb2.ServiceInfo:
        """Info waits up to ``wait_s`` for the channel to be ready: a service that just came up may still sit
        in the channel's reconnect backoff (up to 2 s), where a fail-fast call would report it down."""
        try:
            return await self._stub.Info(common_pb2.InfoRequest(), timeout=wait_s, wait_for_ready=True)
        except grpc.aio.AioRpcError as err:
            raise WorkerRpcError(self.role, "Info", err) from None

    async def renew_credentials(self, credentials: grpc.ChannelCredentials, grace_s: float = 60.0) -> None:
        """New calls go over a new channel with ``credentials`` (a renewed client certificate or CA); calls in
        flight finish on the old one, closed after ``grace_s`` (in the background). Only for a channel this worker
        made."""
        if not self._owns_channel:
            raise RuntimeError("renew_credentials needs a channel this worker made from an address")
        address, interceptors, options = self._dial
        old, self.channel = self.channel, aio_channel(address, interceptors=interceptors, credentials=credentials,
                                                      options=options)
        self._stub = self._make_stub(self.channel)
        self._old_channels = {t for t in self._old_channels if not t.done()}
        self._old_channels.add(asyncio.get_running_loop().create_task(old.close(grace=grace_s)))

    async def close(self) -> None:
        """Close the channel if this worker made it (and at once, any a renewal left closing)."""
        for task in self._old_channels:
            task.cancel()
        if self._owns_channel:
            await self.channel.close()


class GrpcTargetWorker(_GrpcWorker):
    """``TargetWorker`` over a TargetService."""

    role = "target"

    def _make_stub(self, channel: grpc.aio.Channel) -> target_pb2_grpc.TargetServiceStub:
        return target_pb2_grpc.TargetServiceStub(channel)

    feature_spec: FeatureSpec | None = None  # set by the scheduler when its draft reads target features

    def _spec_pb(self) -> dict:
        return {"features": feature_spec_to_pb(self.feature_spec)} if self.feature_spec is not None else {}

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        reply = await self._call(
            "Prefill", target_pb2.TargetPrefillRequest(items=[prefill_item_to_pb(i) for i in items], **self._spec_pb())
        )
        results = [prefill_result_from_pb(o) for o in reply.outputs]
        self._check_ids("Prefill", [i.seq_id for i in items], [r.seq_id for r in results])
        return results

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        reply = await self._call(
            "Verify", target_pb2.VerifyRequest(items=[verify_item_to_pb(i) for i in items], **self._spec_pb())
        )
        answered = [accept_from_pb(o) for o in reply.outputs]
        self._check_ids("Verify", [i.seq_id for i in items], [seq_id for seq_id, _ in answered])
        return [result for _, result in answered]

    async def step(
        self, prefills: list[PrefillItem], verifies: list[VerifyItem]
    ) -> tuple[list[PrefillResult], list[AcceptResult]]:
        """ONE Step RPC: prefill chunks and verify trees in one target forward (chunked prefill)."""
        request = target_pb2.StepRequest(prefills=[prefill_item_to_pb(i) for i in prefills],
                                         verifies=[verify_item_to_pb(i) for i in verifies], **self._spec_pb())
        reply = await self._call("Step", request)
        prefilled = [prefill_result_from_pb(o) for o in reply.prefills]
        answered = [accept_from_pb(o) for o in reply.verifies]
        self._check_ids("Step", [i.seq_id for i in prefills], [r.seq_id for r in prefilled])
        self._check_ids("Step", [i.seq_id for i in verifies], [seq_id for seq_id, _ in answered])
        return prefilled, [result for _, result in answered]

    def want_features(self, spec: FeatureSpec | None) -> None:
        """Return target features with every prefill and verify from now on (None: stop)."""
        self.feature_spec = spec

    async def features(self, seq_ids: list[str], spec: FeatureSpec) -> list[FeatureBlock]:
        """Recompute the features of live sequences (a feature draft's resync)."""
        reply = await self._call(
            "Features", target_pb2.FeaturesRequest(seq_ids=seq_ids, spec=feature_spec_to_pb(spec))
        )
        self._check_ids("Features", seq_ids, [o.seq_id for o in reply.outputs])
        return [feature_block_from_pb(o.features, f"sequence {o.seq_id!r}") for o in reply.outputs]

    async def resize_kv(self, num_blocks: int) -> int:
        """Set the KV pool to ``num_blocks`` (elastic memory, Nightjar §5.1); returns the blocks it now has."""
        return (await self._call("ResizeKV", target_pb2.ResizeKVRequest(num_blocks=num_blocks))).kv_blocks_total


class GrpcDraftWorker(_GrpcWorker):
    """``DraftWorker`` over a DraftService."""

    role = "draft"
    feature_spec: FeatureSpec | None = None  # a feature-level draft's (from its Info; main.py reads it)

    def _make_stub(self, channel: grpc.aio.Channel) -> draft_pb2_grpc.DraftServiceStub:
        return draft_pb2_grpc.DraftServiceStub(channel)

    async def prefill(self, items: list[PrefillItem]) -> None:
        await self._call("Prefill", draft_pb2.DraftPrefillRequest(items=[prefill_item_to_pb(i) for i in items]))

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        reply = await self._call("Speculate", draft_pb2.SpeculateRequest(items=[spec_item_to_pb(i) for i in items]))
        self._check_ids("Speculate", [i.seq_id for i in items], [o.seq_id for o in reply.outputs])
        return [tree_from_pb(o.tree, relay=True) for o in reply.outputs]  # passed on to the target as they came

    async def offload(self) -> int:
        """Weights to host memory, KV pool freed, every sequence dropped (Nightjar §5); bytes moved."""
        return (await self._call("Offload", draft_pb2.OffloadRequest())).bytes_moved

    async def reload(self) -> int:
        """Weights back on the device, a fresh KV pool; bytes moved."""
        return (await self._call("Reload", draft_pb2.ReloadRequest())).bytes_moved
