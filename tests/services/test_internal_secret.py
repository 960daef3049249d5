"""The internal shared secret: a model service refuses callers without it (UNAUTHENTICATED, nothing
changed, the secret never logged), health stays open, and the scheduler that knows it is served."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from services.scheduler.grpc_workers import GrpcTargetWorker
from shared.engine.types import PrefillItem, SamplingParams
from shared.rpc.health_probe import check
from shared.rpc.shared_secret import SecretClientInterceptor, load_secret
from shared.rpc.server import TARGET_SERVICE
from tests.support.model_services import serving

SECRET = "correct horse battery staple"


def test_model_service_answers_only_the_holder_of_the_secret(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO)

    async def main() -> None:
        async with serving(tiny_model_dir, internal_secret=SECRET) as (target, _):
            assert await asyncio.to_thread(check, target.address, TARGET_SERVICE, 2.0) == "SERVING"
            item = PrefillItem("s1", [1, 2, 3], SamplingParams())
            for interceptors in ([], [SecretClientInterceptor("wrong")]):
                stranger = GrpcTargetWorker(target.address, interceptors=interceptors)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stranger.prefill([item])
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "internal secret" in info.value.details()
                await stranger.close()
            scheduler = GrpcTargetWorker(target.address, interceptors=[SecretClientInterceptor(SECRET)])
            [result] = await scheduler.prefill([item])  # s1 was not created by the refused calls
            assert result.seq_id == "s1"
            assert (await scheduler.info()).num_live_seqs == 1
            await scheduler.close()

    asyncio.run(main())
    assert SECRET not in caplog.text and "wrong" not in caplog.text.replace("wrong internal secret", "")


def test_secret_from_a_file_and_empty_is_refused(tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert load_secret(None, path) == "from-file"
    assert load_secret(None) is None
    with pytest.raises(ValueError):
        load_secret("  ")
