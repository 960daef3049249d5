"""Redis with a password: strangers are refused, the URL that carries it serves Tandem's store."""

from __future__ import annotations

import pytest
import redis

from shared.state.redis_server import start_redis
from shared.state.store import RequestRecord, StateStore, StoreConfig


def test_a_password_protected_redis_refuses_strangers_and_serves_its_url() -> None:
    with start_redis(password="s3cr/t pw") as server:
        assert "s3cr%2Ft%20pw@" in server.url
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=server.host, port=server.port).ping()
        with StateStore(StoreConfig(url=server.url, namespace="pw")) as store:
            store.put_request(RequestRecord(request_id="r1"))
            assert store.get_request("r1").request_id == "r1"
