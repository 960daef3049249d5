"""In-process workers: the scheduler drives a TargetEngine / DraftEngine without gRPC (tests, one-process runs).

    scheduler = Scheduler(LocalTargetWorker(target_engine), LocalDraftWorker(draft_engine), ...)

Engine calls are blocking torch, so each runs in a worker thread and the
event loop stays free (streams, aborts, the other worker). The scheduler never
has two calls in flight on one worker (see workers.py), so the engines need no
lock; target and draft may well run at the same time, as two services would.
Engine errors (EngineError subclasses) reach the scheduler unchanged.
"""

from __future__ import annotations

import asyncio

from shared.engine.draft_engine import DraftEngine
from shared.engine.features import FeatureBlock, FeatureSpec
from shared.engine.model_shape import model_shape
from shared.engine.target_engine import TargetEngine
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem


def _release_live(engine: TargetEngine | DraftEngine, seq_ids: list[str]) -> None:
    """Workers' release is idempotent, the engine's is strict: skip the ids it does not hold."""
    engine.release([s for s in dict.fromkeys(seq_ids) if s in engine.runner.seqs])


class LocalTargetWorker:
    def __init__(self, engine: TargetEngine) -> None:
        self.engine = engine
        self.feature_spec: FeatureSpec | None = None  # set by the scheduler when its draft reads features
        self.model_shape = model_shape(engine.runner)  # what chunked prefill prices chunks by (prefill_split.py)

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        return await asyncio.to_thread(self.engine.prefill, items, self.feature_spec)

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        return await asyncio.to_thread(self.engine.verify, items, self.feature_spec)

    async def step(
        self, prefills: list[PrefillItem], verifies: list[VerifyItem]
    ) -> tuple[list[PrefillResult], list[AcceptResult]]:
        """Prefill chunks and verifies in one forward (chunked prefill, prefill_chunks.py)."""
        out = await asyncio.to_thread(self.engine.step, prefills, verifies, self.feature_spec)
        return out.prefills, out.verifies

    def want_features(self, spec: FeatureSpec | None) -> None:
        """Return target features with every prefill and verify from now on (None: stop)."""
        self.feature_spec = spec

    async def features(self, seq_ids: list[str], spec: FeatureSpec) -> list[FeatureBlock]:
        return await asyncio.to_thread(self.engine.features, seq_ids, spec)

    async def release(self, seq_ids: list[str]) -> None:
        await asyncio.to_thread(_release_live, self.engine, seq_ids)

    async def resize_kv(self, num_blocks: int) -> int:
        await asyncio.to_thread(self.engine.resize_kv, num_blocks)
        return self.engine.runner.cache.num_blocks


class LocalDraftWorker:
    def __init__(self, engine: DraftEngine) -> None:
        self.engine = engine
        self.feature_spec: FeatureSpec | None = getattr(engine, "spec", None)  # a feature-level draft's

    async def prefill(self, items: list[PrefillItem]) -> None:
        await asyncio.to_thread(self.engine.prefill, items)

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        return await asyncio.to_thread(self.engine.speculate, items)

    async def release(self, seq_ids: list[str]) -> None:
        await asyncio.to_thread(_release_live, self.engine, seq_ids)

    async def offload(self) -> int:
        moved, _ = await asyncio.to_thread(self.engine.offload)
        return moved

    async def reload(self) -> int:
        return await asyncio.to_thread(self.engine.reload)
