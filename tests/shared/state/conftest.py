"""A real redis-server for the whole session (started by shared.state.redis_server)."""

from __future__ import annotations

import uuid

import pytest

from shared.state.redis_server import RedisServer, start_redis
from shared.state.store import StateStore, StoreConfig


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def store_config(redis_server: RedisServer) -> StoreConfig:
    """A fresh namespace per test, so tests share the server but never each other's keys."""
    return StoreConfig(url=redis_server.url, namespace=f"test-{uuid.uuid4().hex[:8]}", ema_alpha=0.5)


@pytest.fixture
def store(store_config: StoreConfig) -> StateStore:
    with StateStore(store_config) as s:
        yield s
