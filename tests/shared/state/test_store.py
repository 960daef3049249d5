"""StateStore and the local Redis launcher, against a real redis-server."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
import redis

from shared.state.redis_server import RedisStartError, find_redis_server, start_redis
from shared.state.store import (
    AsyncStateStore,
    RequestRecord,
    RequestState,
    StateStore,
    StepOutcome,
    StoreConfig,
)


def _run_threads(target, n: int) -> None:
    """Run ``target`` in n threads; fail with the first exception any of them raised."""
    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=guarded) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- the launcher ------------------------------------------------------------------------------


def test_redis_server_starts_answers_and_stops() -> None:
    assert os.access(find_redis_server(), os.X_OK)
    with start_redis() as a, start_redis() as b:
        assert a.port != b.port and a.url.startswith("redis://127.0.0.1:")
        client = redis.Redis.from_url(a.url)
        assert client.ping()
        assert client.config_get("save") == {"save": ""} and client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        client.close()
        workdir = a.workdir
    assert not a.running and not b.running and not os.path.exists(workdir)
    a.stop()  # idempotent


def test_redis_server_reports_a_failed_start() -> None:
    with pytest.raises(RedisStartError, match="did not start"):
        start_redis(binary="/bin/false", timeout_s=2)


# --- request records ---------------------------------------------------------------------------


def _record(request_id: str = "r1", **kw) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, prompt_len=12, max_new_tokens=64, slo_tpot_ms=50.0, arrival_unix_ns=1_000, **kw
    )


def test_request_record_round_trip_ttl_and_live_set(store: StateStore, store_config: StoreConfig) -> None:
    record = _record(policy="smartspec", priority=2)
    store.put_request(record)
    assert store.get_request("r1") == record
    assert store.get_request("missing") is None
    raw = redis.Redis.from_url(store_config.url)
    key = f"{store_config.namespace}:v1:request:r1"
    assert raw.type(key) == b"hash"
    assert 0 < raw.ttl(key) <= store_config.request_ttl_s
    assert store.live_request_ids() == ["r1"]

    store.update_request("r1", state=RequestState.RUNNING, slo_tpot_ms=None)
    got = store.get_request("r1")
    assert got.state == RequestState.RUNNING and got.slo_tpot_ms is None and got.policy == "smartspec"

    store.put_request(_record("r2"))
    store.finish_request("r1", finish_reason="length", now_ns=9_000)
    got = store.get_request("r1")
    assert (got.state, got.finish_reason, got.finish_unix_ns) == (RequestState.FINISHED, "length", 9_000)
    assert store.live_request_ids() == ["r2"]

    raw.delete(f"{store_config.namespace}:v1:request:r2")  # as if its TTL ran out
    assert store.live_request_ids() == []
    assert all(
        k.decode().startswith(f"{store_config.namespace}:v1:") for k in raw.scan_iter(f"{store_config.namespace}:*")
    )
    raw.close()


def test_bad_updates_are_rejected(store: StateStore) -> None:
    store.put_request(_record())
    with pytest.raises(ValueError, match="no_such_field"):
        store.update_request("r1", no_such_field=1)
    with pytest.raises(ValueError):
        store.update_request("r1", state="exploded")
    with pytest.raises(ValueError, match="accepted"):
        store.commit(StepOutcome(request_id="r1", token_ids=[1], num_proposed=1, num_accepted=2))
    with pytest.raises(ValueError):
        store.acceptance("policy")  # a policy scope needs a name


# --- the per-iteration commit ------------------------------------------------------------------


def test_commit_step_appends_tokens_and_times(store: StateStore) -> None:
    store.put_request(_record("a"))
    store.put_request(_record("b"))
    assert store.commit_step(
        [
            StepOutcome(request_id="a", token_ids=[5]),
            StepOutcome(request_id="b", token_ids=[7, 8, 9], num_proposed=3, num_accepted=2),
        ],
        now_ns=2_000_000,
    ) == [1, 3]
    assert store.commit_step([StepOutcome(request_id="a", token_ids=[6, 7])], now_ns=6_000_000) == [3]
    assert store.get_tokens("a") == [5, 6, 7] and store.get_tokens("b") == [7, 8, 9]
    a = store.get_request("a")
    assert (a.num_generated, a.first_token_unix_ns, a.last_token_unix_ns) == (3, 2_000_000, 6_000_000)
    assert a.ttft_ms == pytest.approx(1.999) and a.tpot_ms == pytest.approx(2.0)
    # an unknown request keeps no record but its step still counts globally
    assert store.commit(StepOutcome(request_id="ghost", token_ids=[1])) == -1
    assert store.get_request("ghost") is None and store.get_tokens("ghost") == []
    assert store.acceptance().num_steps == 4
    # a long step (more tokens than one Lua unpack takes)
    store.put_request(_record("long"))
    assert store.commit(StepOutcome(request_id="long", token_ids=list(range(1200)))) == 1200
    assert store.get_tokens("long") == list(range(1200))


def test_acceptance_statistics_and_moving_averages(store: StateStore) -> None:
    alpha = store.config.ema_alpha
    store.put_request(_record("r"))
    steps = [(4, 4), (4, 1), (0, 0), (2, 0), (4, 3)]  # (proposed, accepted); (0, 0) is a plain decode step
    ema_rate = ema_len = None
    for proposed, accepted in steps:
        store.commit(
            StepOutcome(
                request_id="r",
                token_ids=[1] * (accepted + 1),
                num_proposed=proposed,
                num_accepted=accepted,
                policy="smartspec",
            )
        )
        length = accepted + 1
        ema_len = length if ema_len is None else ema_len + alpha * (length - ema_len)
        if proposed:
            rate = accepted / proposed
            ema_rate = rate if ema_rate is None else ema_rate + alpha * (rate - ema_rate)

    for scope, name in [("global", None), ("policy", "smartspec"), ("request", "r")]:
        stats = store.acceptance(scope, name)
        assert (stats.num_steps, stats.num_proposed, stats.num_accepted) == (5, 14, 8), scope
        assert stats.ema_acceptance_rate == pytest.approx(ema_rate)
        assert stats.ema_accepted_length == pytest.approx(ema_len)
        assert stats.acceptance_rate == pytest.approx(8 / 14)
        assert stats.mean_accepted_length == pytest.approx((8 + 5) / 5)
        assert stats.position_proposed == [4, 4, 3, 3]
        assert stats.position_accepted == [3, 2, 2, 1]
        assert stats.position_acceptance[0] == pytest.approx(0.75)
    assert store.acceptance("policy", "other").num_steps == 0
    raw = redis.Redis.from_url(store.config.url)
    assert raw.ttl(store.keys.stats_key("request", "r")) > 0
    assert raw.ttl(store.keys.stats_key("global")) == -1  # global statistics do not expire
    raw.close()


def test_tree_depth_drives_position_counters(store: StateStore) -> None:
    store.put_request(_record("t"))
    store.commit(StepOutcome(request_id="t", token_ids=[1, 2, 3], num_proposed=8, num_accepted=2, depth=3))
    stats = store.acceptance("request", "t")
    assert stats.position_proposed == [1, 1, 1] and stats.position_accepted == [1, 1, 0]


def test_concurrent_commits_are_atomic(store: StateStore, store_config: StoreConfig) -> None:
    store.put_request(_record("c"))

    def worker() -> None:
        with StateStore(store_config) as mine:
            for _ in range(50):
                mine.commit(StepOutcome(request_id="c", token_ids=[1, 2], num_proposed=2, num_accepted=1))

    _run_threads(worker, 4)
    stats = store.acceptance()
    assert (stats.num_steps, stats.num_proposed, stats.num_accepted) == (200, 400, 200)
    assert stats.ema_acceptance_rate == pytest.approx(0.5)
    assert store.get_request("c").num_generated == 400 and len(store.get_tokens("c")) == 400


def test_commit_survives_a_flushed_script_cache(store: StateStore) -> None:
    store.put_request(_record("s"))
    store.commit(StepOutcome(request_id="s", token_ids=[1]))
    redis.Redis.from_url(store.config.url).script_flush()  # what a Redis restart does
    assert store.commit(StepOutcome(request_id="s", token_ids=[2])) == 2
    assert store.get_tokens("s") == [1, 2]  # nothing applied twice


# --- JSON blobs --------------------------------------------------------------------------------


def test_json_blobs(store: StateStore, store_config: StoreConfig) -> None:
    assert store.get_json("nightjar/bs8", default={"arms": []}) == {"arms": []}
    store.put_json("nightjar/bs8", {"arms": [0.5, 1.25], "round": 3})
    assert store.get_json("nightjar/bs8") == {"arms": [0.5, 1.25], "round": 3}
    store.put_json("short", [1], ttl_s=60)
    assert 0 < redis.Redis.from_url(store_config.url).ttl(store.keys.blob_key("short")) <= 60

    def bump() -> None:
        with StateStore(store_config) as mine:
            for _ in range(25):
                mine.update_json("counter", lambda v: {"n": v["n"] + 1}, default={"n": 0})

    _run_threads(bump, 4)
    assert store.get_json("counter") == {"n": 100}
    store.delete_json("counter")
    assert store.get_json("counter") is None


# --- asyncio -----------------------------------------------------------------------------------


def test_async_store(store_config: StoreConfig) -> None:
    async def main() -> None:
        async with AsyncStateStore(store_config) as store:
            assert await store.ping()
            await store.put_request(_record("x"))
            await store.update_request("x", state=RequestState.RUNNING)
            assert await store.live_request_ids() == ["x"]
            assert await store.commit_step(
                [StepOutcome(request_id="x", token_ids=[3, 4], num_proposed=2, num_accepted=1, policy="fixed")]
            ) == [2]
            assert await store.get_tokens("x") == [3, 4]
            stats = await store.acceptance("policy", "fixed")
            assert (stats.num_steps, stats.num_accepted, stats.ema_acceptance_rate) == (1, 1, 0.5)
            await store.finish_request("x", RequestState.ABORTED, finish_reason="aborted")
            assert (await store.get_request("x")).state == RequestState.ABORTED
            assert await store.live_request_ids() == []
            await store.put_json("p", {"k": 1})
            assert await store.update_json("p", lambda v: {"k": v["k"] + 1}) == {"k": 2}
            await store.delete_request("x")
            assert await store.get_request("x") is None

    asyncio.run(main())
    # both clients see the same data
    with StateStore(store_config) as sync:
        assert sync.get_json("p") == {"k": 2}
