"""The target's feature push to a draft on this host: through the shared-memory ring, and over gRPC for good
once the draft says it cannot read the ring (FAILED_PRECONDITION); the rows reach the draft's inbox either way."""

from __future__ import annotations

import asyncio

from services.target.feature_push import FeaturePusher
from shared.engine.features import FeatureBlock
from shared.rpc import shared_rows
from tests.support.model_services import serving


def rows(start: int, n: int, fill: int) -> FeatureBlock:
    return FeatureBlock(start, n, 4, "float16", bytes([fill]) * (8 * n))


def test_rows_go_through_the_ring_and_over_grpc_once_the_draft_cannot_read_it(tiny_model_dir, monkeypatch):
    async def main():
        async with serving(tiny_model_dir, tiny_model_dir) as (_, draft):
            pusher = FeaturePusher(None)
            servicer_inbox = draft.engine_host.feature_inbox
            assert await pusher.push(draft.address, ["a"], [rows(0, 2, 1)])
            assert (await servicer_inbox.take("a", 0, 2)).data == rows(0, 2, 1).data
            assert pusher.bytes_shared == pusher.bytes_pushed == 16

            def refuse(self, *args):
                raise OSError("no such segment here")

            monkeypatch.setattr(shared_rows.RingReader, "read", refuse)
            await pusher.push(draft.address, ["a"], [rows(2, 1, 2)])  # the draft ends the stream on this one
            await asyncio.sleep(0.2)
            assert not await pusher.push(draft.address, ["a"], [rows(2, 1, 2)])  # the scheduler relays it
            assert await pusher.push(draft.address, ["b"], [rows(0, 1, 3)])  # a new stream, over gRPC
            assert (await servicer_inbox.take("b", 0, 1)).data == rows(0, 1, 3).data
            # the ring: the first push and the one the draft refused (written before it said so); not the last
            assert (pusher.bytes_shared, pusher.bytes_pushed) == (24, 32) and draft.address in pusher._refused
            pusher.close()
            pusher._close_channel()

    asyncio.run(main())

