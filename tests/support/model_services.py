"""Model services on loopback for tests: tiny random models, real grpc.aio servers on port 0.

    async with serving(target_dir, draft_dir) as (target, draft):   # RunningService each
        ...target.address...

Each test runs its own event loop (``asyncio.run``) and starts its servers
inside it: a tiny model loads in tens of milliseconds.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path

from services.runtime import RunningService
from services.settings import ServiceSettings

NUM_BLOCKS = 64
BLOCK_SIZE = 4


def model_settings(model_dir: Path, **overrides) -> ServiceSettings:
    defaults = {"model": str(model_dir), "port": 0, "device": "cpu", "num_blocks": NUM_BLOCKS, "block_size": BLOCK_SIZE}
    return ServiceSettings(**(defaults | {"shutdown_grace_s": 0.5} | overrides))


@asynccontextmanager
async def serving(
    target_dir: Path, draft_dir: Path | None = None, **overrides
) -> AsyncIterator[tuple[RunningService, RunningService | None]]:
    from services.model_main import start as start_model

    target = await start_model(model_settings(target_dir, **overrides), "target")
    draft = await start_model(model_settings(draft_dir, **overrides), "draft") if draft_dir is not None else None
    try:
        yield target, draft
    finally:
        for running in (draft, target):
            if running is not None:
                await running.stop(0)


@cache
def greedy_reference(model_dir: Path, prompt: tuple[int, ...], num_tokens: int) -> list[int]:
    """Target-only greedy decoding with transformers' own attention, no KV cache: the ground truth."""
    import torch

    model = _reference_model(model_dir)
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@cache
def _reference_model(model_dir: Path):
    from shared.engine.loading import load_causal_lm

    return load_causal_lm(model_dir, device="cpu", with_tokenizer=False).model


async def health_status(address: str, service: str = "") -> str:
    """The grpc.health.v1 status name, or the RPC's status code name when the check itself fails."""
    import grpc.aio
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        except grpc.aio.AioRpcError as err:
            return err.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def free_port() -> int:
    """A port nobody listens on right now (to start a server there, or to dial a dead service)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
