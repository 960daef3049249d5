"""The public endpoint with API keys and TLS: missing or wrong keys get UNAUTHENTICATED (nothing queued,
no key logged), health stays open, the SDK's api_key is served; over TLS only a client that trusts the
certificate gets through."""

from __future__ import annotations

import asyncio
import logging
import subprocess

import pytest

from sdk import AsyncClient
from sdk.errors import TandemError
from services.settings import ServiceSettings
from shared.rpc.api_keys import bearer, key_matches, load_keys
from shared.state.redis_server import start_redis
from tests.support.model_services import serving

KEYS = "key-one,key-two"


def _cert(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


def test_keys_and_tls_on_the_public_endpoint(tiny_model_dir, tmp_path, caplog):
    from services.scheduler.main import start

    caplog.set_level(logging.INFO)
    cert, key = _cert(tmp_path)

    async def main(url: str) -> None:
        async with serving(tiny_model_dir, num_blocks=64) as (target, _):
            settings = ServiceSettings(model=str(tiny_model_dir), target_addr=target.address, draft_addr="none",
                                       redis_url=url, port=0, trace_exporter="memory", metrics_port=None,
                                       home=tmp_path, max_batch_size=2, api_keys=KEYS, tls_cert=cert, tls_key=key)
            running = await asyncio.wait_for(start(settings), timeout=60)
            address = running.address
            try:
                for api_key, words in ((None, "missing API key"), ("key-three", "invalid API key")):
                    async with AsyncClient(address, api_key=api_key or "", root_certificates=cert, timeout=20) as c:
                        assert await c.health() == "SERVING"  # probes need no key
                        with pytest.raises(TandemError, match=words) as info:
                            await c.generate([1, 2, 3], max_new_tokens=3)
                        assert info.value.code == "UNAUTHENTICATED"
                assert running.scheduler.waiting == () and running.scheduler.running == ()
                async with AsyncClient(address, api_key="key-two", root_certificates=cert, timeout=20) as c:
                    result = await c.generate([1, 2, 3], max_new_tokens=3)
                    assert len(result.token_ids) == 3
                async with AsyncClient(address, api_key="key-one", timeout=5) as plain:  # no TLS: no connection
                    with pytest.raises(TandemError) as info:
                        await plain.generate([1, 2, 3], max_new_tokens=3)
                    assert info.value.code == "UNAVAILABLE"
            finally:
                await running.stop(0)

    with start_redis() as redis:
        asyncio.run(main(redis.url))
    assert "key-one" not in caplog.text and "key-two" not in caplog.text and "key-three" not in caplog.text


def test_key_parsing(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# team A\nalpha\n\n  beta  \n")
    assert load_keys("x, y,,", path) == {"x", "y", "alpha", "beta"}
    assert load_keys() == frozenset()
    assert bearer("Bearer abc") == "abc" and bearer("bearer abc") == "abc"
    assert bearer("Basic abc") is None and bearer(None) is None and bearer("Bearer ") is None
    assert key_matches("beta", {"alpha", "beta"}) and not key_matches("gamma", {"alpha"}) and not key_matches(None, {"a"})
