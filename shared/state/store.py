"""Scheduler state in Redis: request records, acceptance statistics, policy blobs.

Keys are namespaced and versioned (``{namespace}:v1:...``; bump ``KEY_VERSION``
when a record's layout changes, so old and new replicas never read each
other's records)::

    tandem:v1:request:{id}            hash   RequestRecord fields (TTL)
    tandem:v1:request:{id}:tokens     list   generated token ids (TTL)
    tandem:v1:requests:live           set    ids of queued / running requests
    tandem:v1:accept:global           hash   acceptance statistics, all requests
    tandem:v1:accept:policy:{name}    hash   ... per speculation policy
    tandem:v1:accept:request:{id}     hash   ... per request (TTL)
    tandem:v1:blob:{name}             string JSON (learned policy state)

Hot path: the scheduler calls ``commit_step`` once per iteration with every
request's outcome; that is one round trip (a pipeline of one Lua script call
per request). Each script call is atomic: it appends the tokens, moves the
timestamps and updates the three acceptance scopes (counts, per-position
counts, exponential moving averages) together, so replicas sharing the
statistics never interleave half-updates.

``StateStore`` uses the blocking redis-py client, ``AsyncStateStore`` the
asyncio one; both queue the same commands (``_Ops``) and parse the same way.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import redis
import redis.asyncio
from pydantic import BaseModel, Field
from redis.exceptions import NoScriptError, WatchError

KEY_VERSION = "v1"


class StoreConfig(BaseModel):
    """Where the state lives and how long it is kept."""

    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (redis://host:port/db).")
    namespace: str = Field("tandem", description="Key prefix; separate deployments (or tests) by namespace.")
    request_ttl_s: int = Field(24 * 3600, ge=1, description="Lifetime of request records and per-request statistics.")
    ema_alpha: float = Field(
        0.1, gt=0.0, le=1.0, description="Weight of the newest step in the acceptance moving averages."
    )
    max_positions: int = Field(32, ge=1, description="Speculation positions (depths) with their own counters.")


class RequestState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


LIVE_STATES = frozenset({RequestState.QUEUED, RequestState.RUNNING})


class RequestRecord(BaseModel):
    """What survives a scheduler restart about one request (tokens are kept beside it)."""

    request_id: str
    state: RequestState = RequestState.QUEUED
    prompt_len: int = 0
    max_new_tokens: int = 0
    num_generated: int = Field(0, description="Tokens generated so far (the length of the token list).")
    priority: int = 0
    slo_tpot_ms: float | None = None
    slo_ttft_ms: float | None = None
    policy: str | None = Field(None, description="Speculation policy serving the request.")
    arrival_unix_ns: int = 0
    first_token_unix_ns: int | None = None
    last_token_unix_ns: int | None = None
    finish_unix_ns: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    owner: str | None = Field(None, description="Instance id of the scheduler serving it (shared.state.ownership).")

    @property
    def ttft_ms(self) -> float | None:
        if self.first_token_unix_ns is None or not self.arrival_unix_ns:
            return None
        return (self.first_token_unix_ns - self.arrival_unix_ns) / 1e6

    @property
    def tpot_ms(self) -> float | None:
        """(t_last - t_first) / (n - 1); None with fewer than two tokens."""
        if self.num_generated < 2 or self.first_token_unix_ns is None or self.last_token_unix_ns is None:
            return None
        return (self.last_token_unix_ns - self.first_token_unix_ns) / 1e6 / (self.num_generated - 1)


class AcceptanceStats(BaseModel):
    """Acceptance of speculation in one scope (global, a policy, a request)."""

    num_steps: int = 0
    num_proposed: int = Field(0, description="Draft tokens verified.")
    num_accepted: int = Field(0, description="Draft tokens accepted.")
    ema_acceptance_rate: float | None = Field(None, description="Moving average of accepted/proposed per step.")
    ema_accepted_length: float | None = Field(
        None, description="Moving average of tokens committed per step, bonus included."
    )
    position_proposed: list[int] = Field(default_factory=list, description="Steps that proposed position i.")
    position_accepted: list[int] = Field(default_factory=list, description="Steps that accepted position i.")
    updated_unix_ns: int | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted / self.num_proposed if self.num_proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per step, bonus included (1.0 without speculation)."""
        return (self.num_accepted + self.num_steps) / self.num_steps if self.num_steps else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """P(position i accepted | position i proposed)."""
        return [a / p if p else 0.0 for a, p in zip(self.position_accepted, self.position_proposed)]


class StepOutcome(BaseModel):
    """One request's result of one iteration, as ``commit_step`` records it."""

    request_id: str
    token_ids: list[int] = Field(default_factory=list, description="Tokens committed this step (accepted + bonus).")
    num_proposed: int = Field(0, ge=0, description="Draft tokens verified this step (0: plain decode).")
    num_accepted: int = Field(0, ge=0, description="Draft tokens accepted this step.")
    depth: int | None = Field(
        None, ge=0, description="Deepest proposed position (tree depth); default num_proposed (a chain)."
    )
    policy: str | None = Field(None, description="Speculation policy that chose this step's shape.")


# One request, one step, atomically. KEYS: request hash, token list, global stats,
# request stats[, policy stats]. ARGV: now_ns, ttl_s, alpha, max_positions, proposed, accepted,
# depth, tokens... Returns num_generated, or -1 when the request has no record (stats still count).
_COMMIT_LUA = """
local now, ttl, alpha = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local maxpos, p, a, depth = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local generated = -1
if redis.call('EXISTS', KEYS[1]) == 1 then
  local n = #ARGV - 7
  if n > 0 then
    for i = 8, #ARGV, 500 do
      redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 499, #ARGV)))
    end
    redis.call('HSETNX', KEYS[1], 'first_token_unix_ns', now)
    redis.call('HSET', KEYS[1], 'last_token_unix_ns', now)
  end
  generated = redis.call('HINCRBY', KEYS[1], 'num_generated', n)
  redis.call('EXPIRE', KEYS[1], ttl)
  if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('EXPIRE', KEYS[2], ttl) end
end
for k = 3, #KEYS do
  local key = KEYS[k]
  redis.call('HINCRBY', key, 'num_steps', 1)
  redis.call('HINCRBY', key, 'num_proposed', p)
  redis.call('HINCRBY', key, 'num_accepted', a)
  local len = a + 1
  local ema = redis.call('HGET', key, 'ema_accepted_length')
  if ema then len = tonumber(ema) + alpha * (len - tonumber(ema)) end
  redis.call('HSET', key, 'ema_accepted_length', tostring(len))
  if p > 0 then
    local rate = a / p
    ema = redis.call('HGET', key, 'ema_acceptance_rate')
    if ema then rate = tonumber(ema) + alpha * (rate - tonumber(ema)) end
    redis.call('HSET', key, 'ema_acceptance_rate', tostring(rate))
    for j = 0, math.min(depth, maxpos) - 1 do
      redis.call('HINCRBY', key, 'pos:' .. j .. ':proposed', 1)
      if j < a then redis.call('HINCRBY', key, 'pos:' .. j .. ':accepted', 1) end
    end
  end
  redis.call('HSET', key, 'updated_unix_ns', now)
  if k == 4 then redis.call('EXPIRE', key, ttl) end
end
return generated
"""


def _now_ns() -> int:
    return time.time_ns()


def _backoff_s(attempt: int) -> float:
    """Jittered, growing pause after a lost WATCH race, so contending writers spread out."""
    return random.uniform(0, min(0.05, 0.0005 * 2 ** min(attempt, 7)))


def _encode_record(record: RequestRecord) -> tuple[dict[str, str], list[str]]:
    """Hash fields to set and fields to delete (None values are absent fields)."""
    data = record.model_dump(mode="json")
    present = {k: str(v) for k, v in data.items() if v is not None}
    absent = [k for k, v in data.items() if v is None]
    return present, absent


def _decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()
    }


def _decode_stats(raw: dict[Any, Any]) -> AcceptanceStats:
    h = _decode_hash(raw)
    positions: dict[int, dict[str, int]] = {}
    for key, value in h.items():
        if key.startswith("pos:"):
            _, index, kind = key.split(":")
            positions.setdefault(int(index), {})[kind] = int(value)
    size = max(positions) + 1 if positions else 0
    return AcceptanceStats(
        num_steps=int(h.get("num_steps", 0)),
        num_proposed=int(h.get("num_proposed", 0)),
        num_accepted=int(h.get("num_accepted", 0)),
        ema_acceptance_rate=float(h["ema_acceptance_rate"]) if "ema_acceptance_rate" in h else None,
        ema_accepted_length=float(h["ema_accepted_length"]) if "ema_accepted_length" in h else None,
        position_proposed=[positions.get(i, {}).get("proposed", 0) for i in range(size)],
        position_accepted=[positions.get(i, {}).get("accepted", 0) for i in range(size)],
        updated_unix_ns=int(h["updated_unix_ns"]) if "updated_unix_ns" in h else None,
    )


class _Ops:
    """Key layout and the commands of each operation, queued on a (sync or asyncio) pipeline."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.prefix = f"{config.namespace}:{KEY_VERSION}:"
        self.live_key = self.key("requests", "live")

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def request_key(self, request_id: str) -> str:
        return self.key("request", request_id)

    def tokens_key(self, request_id: str) -> str:
        return self.key("request", request_id, "tokens")

    def stats_key(self, scope: str, name: str | None = None) -> str:
        if scope == "global":
            return self.key("accept", "global")
        if scope not in ("policy", "request") or not name:
            raise ValueError(f"acceptance scope must be global, policy NAME or request ID; got {scope!r} {name!r}")
        return self.key("accept", scope, name)

    def blob_key(self, name: str) -> str:
        if not name:
            raise ValueError("blob name must not be empty")
        return self.key("blob", name)

    def put_request(self, pipe: Any, record: RequestRecord) -> None:
        present, absent = _encode_record(record)
        key = self.request_key(record.request_id)
        if absent:
            pipe.hdel(key, *absent)
        pipe.hset(key, mapping=present)
        pipe.expire(key, self.config.request_ttl_s)
        self._track_live(pipe, record.request_id, record.state)

    def update_request(self, pipe: Any, request_id: str, fields: dict[str, Any]) -> None:
        unknown = set(fields) - set(RequestRecord.model_fields) | ({"request_id"} & set(fields))
        if unknown:
            raise ValueError(f"cannot update request field(s) {sorted(unknown)}")
        # validate and normalise through the model (e.g. state strings, numbers)
        partial = RequestRecord.model_validate({"request_id": request_id, **fields}).model_dump(mode="json")
        key = self.request_key(request_id)
        present = {k: str(partial[k]) for k in fields if partial[k] is not None}
        absent = [k for k in fields if partial[k] is None]
        if absent:
            pipe.hdel(key, *absent)
        if present:
            pipe.hset(key, mapping=present)
        pipe.expire(key, self.config.request_ttl_s)
        if "state" in fields:
            self._track_live(pipe, request_id, RequestState(partial["state"]))

    def _track_live(self, pipe: Any, request_id: str, state: RequestState) -> None:
        if state in LIVE_STATES:
            pipe.sadd(self.live_key, request_id)
        else:
            pipe.srem(self.live_key, request_id)

    def commit(self, pipe: Any, sha: str, outcome: StepOutcome, now_ns: int) -> None:
        keys = [
            self.request_key(outcome.request_id),
            self.tokens_key(outcome.request_id),
            self.stats_key("global"),
            self.stats_key("request", outcome.request_id),
        ]
        if outcome.policy:
            keys.append(self.stats_key("policy", outcome.policy))
        c = self.config
        depth = outcome.depth if outcome.depth is not None else outcome.num_proposed
        args = [
            now_ns,
            c.request_ttl_s,
            c.ema_alpha,
            c.max_positions,
            outcome.num_proposed,
            outcome.num_accepted,
            depth,
        ]
        pipe.evalsha(sha, len(keys), *keys, *args, *outcome.token_ids)

    def delete_request(self, pipe: Any, request_id: str) -> None:
        pipe.delete(self.request_key(request_id), self.tokens_key(request_id), self.stats_key("request", request_id))
        pipe.srem(self.live_key, request_id)


def _check_outcomes(outcomes: Sequence[StepOutcome]) -> None:
    for o in outcomes:
        if o.num_accepted > o.num_proposed:
            raise ValueError(f"{o.request_id}: {o.num_accepted} accepted > {o.num_proposed} proposed")


class StateStore:
    """Blocking store over redis-py. Pass ``client`` to use an existing (or fake) client."""

    def __init__(self, config: StoreConfig | None = None, *, client: redis.Redis | None = None) -> None:
        self.config = config or StoreConfig()
        self._r = client if client is not None else redis.Redis.from_url(self.config.url)
        self._ops = _Ops(self.config)
        self._commit_sha: str | None = None

    @property
    def keys(self) -> _Ops:
        """The key layout (``store.keys.request_key(id)`` etc.)."""
        return self._ops

    def close(self) -> None:
        self._r.close()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> bool:
        return bool(self._r.ping())

    # --- requests ---------------------------------------------------------------------------

    def put_request(self, record: RequestRecord) -> None:
        """Create or replace a request record (the token list is left alone)."""
        pipe = self._r.pipeline(transaction=True)
        self._ops.put_request(pipe, record)
        pipe.execute()

    def update_request(self, request_id: str, **fields: Any) -> None:
        """Set some fields (None removes one); state changes keep the live set in step."""
        pipe = self._r.pipeline(transaction=True)
        self._ops.update_request(pipe, request_id, fields)
        pipe.execute()

    def finish_request(
        self,
        request_id: str,
        state: RequestState = RequestState.FINISHED,
        finish_reason: str | None = None,
        error: str | None = None,
        now_ns: int | None = None,
    ) -> None:
        self.update_request(
            request_id, state=state, finish_reason=finish_reason, error=error, finish_unix_ns=now_ns or _now_ns()
        )

    def get_request(self, request_id: str) -> RequestRecord | None:
        raw = self._r.hgetall(self._ops.request_key(request_id))
        return RequestRecord.model_validate(_decode_hash(raw)) if raw else None

    def get_tokens(self, request_id: str) -> list[int]:
        return [int(t) for t in self._r.lrange(self._ops.tokens_key(request_id), 0, -1)]

    def live_request_ids(self) -> list[str]:
        """Queued or running requests (e.g. to resume after a restart); expired records are pruned."""
        ids = sorted(m.decode() if isinstance(m, bytes) else m for m in self._r.smembers(self._ops.live_key))
        pipe = self._r.pipeline(transaction=False)
        for request_id in ids:
            pipe.exists(self._ops.request_key(request_id))
        alive = pipe.execute()
        gone = [i for i, ok in zip(ids, alive) if not ok]
        if gone:
            self._r.srem(self._ops.live_key, *gone)
        return [i for i, ok in zip(ids, alive) if ok]

    def delete_request(self, request_id: str) -> None:
        pipe = self._r.pipeline(transaction=True)
        self._ops.delete_request(pipe, request_id)
        pipe.execute()

    # --- the per-iteration commit --------------------------------------------------------------

    def commit_step(self, outcomes: Sequence[StepOutcome], now_ns: int | None = None) -> list[int]:
        """Record one iteration for every request in one round trip; returns each num_generated (-1: no record)."""
        if not outcomes:
            return []
        _check_outcomes(outcomes)
        now_ns = now_ns or _now_ns()
        for _ in range(2):
            if self._commit_sha is None:
                self._commit_sha = self._r.script_load(_COMMIT_LUA)
            pipe = self._r.pipeline(transaction=False)
            for outcome in outcomes:
                self._ops.commit(pipe, self._commit_sha, outcome, now_ns)
            try:
                return [int(n) for n in pipe.execute()]
            except NoScriptError:  # Redis restarted and lost its script cache: nothing ran, so retry
                self._commit_sha = None
        raise RuntimeError("Redis keeps losing the commit script")

    def commit(self, outcome: StepOutcome, now_ns: int | None = None) -> int:
        return self.commit_step([outcome], now_ns)[0]

    # --- acceptance statistics ----------------------------------------------------------------

    def acceptance(self, scope: str = "global", name: str | None = None) -> AcceptanceStats:
        """Statistics of ``global``, ``policy`` NAME or ``request`` ID."""
        return _decode_stats(self._r.hgetall(self._ops.stats_key(scope, name)))

    # --- JSON blobs (learned policy state) ----------------------------------------------------

    def put_json(self, name: str, value: Any, ttl_s: int | None = None) -> None:
        self._r.set(self._ops.blob_key(name), json.dumps(value), ex=ttl_s)

    def get_json(self, name: str, default: Any = None) -> Any:
        raw = self._r.get(self._ops.blob_key(name))
        return json.loads(raw) if raw is not None else default

    def update_json(self, name: str, fn: Callable[[Any], Any], default: Any = None, retries: int = 64) -> Any:
        """Read-modify-write with optimistic locking (WATCH): ``fn`` may run more than once."""
        key = self._ops.blob_key(name)
        with self._r.pipeline(transaction=True) as pipe:
            for attempt in range(retries):
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    value = fn(json.loads(raw) if raw is not None else default)
                    pipe.multi()
                    pipe.set(key, json.dumps(value))
                    pipe.execute()
                    return value
                except WatchError:
                    time.sleep(_backoff_s(attempt))
        raise RuntimeError(f"update_json({name!r}) lost the race {retries} times")

    def delete_json(self, name: str) -> None:
        self._r.delete(self._ops.blob_key(name))


class AsyncStateStore:
    """``StateStore`` over redis.asyncio, for the scheduler's event loop; same methods, awaited."""

    def __init__(self, config: StoreConfig | None = None, *, client: redis.asyncio.Redis | None = None) -> None:
        self.config = config or StoreConfig()
        self._r = client if client is not None else redis.asyncio.Redis.from_url(self.config.url)
        self._ops = _Ops(self.config)
        self._commit_sha: str | None = None

    @property
    def keys(self) -> _Ops:
        return self._ops

    @property
    def client(self) -> redis.asyncio.Redis:
        return self._r

    async def close(self) -> None:
        await self._r.aclose()

    async def __aenter__(self) -> "AsyncStateStore":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def ping(self) -> bool:
        return bool(await self._r.ping())

    async def put_request(self, record: RequestRecord) -> None:
        pipe = self._r.pipeline(transaction=True)
        self._ops.put_request(pipe, record)
        await pipe.execute()

    async def update_request(self, request_id: str, **fields: Any) -> None:
        pipe = self._r.pipeline(transaction=True)
        self._ops.update_request(pipe, request_id, fields)
        await pipe.execute()

    async def finish_request(
        self,
        request_id: str,
        state: RequestState = RequestState.FINISHED,
        finish_reason: str | None = None,
        error: str | None = None,
        now_ns: int | None = None,
    ) -> None:
        await self.update_request(
            request_id, state=state, finish_reason=finish_reason, error=error, finish_unix_ns=now_ns or _now_ns()
        )

    async def get_request(self, request_id: str) -> RequestRecord | None:
        raw = await self._r.hgetall(self._ops.request_key(request_id))
        return RequestRecord.model_validate(_decode_hash(raw)) if raw else None

    async def get_tokens(self, request_id: str) -> list[int]:
        return [int(t) for t in await self._r.lrange(self._ops.tokens_key(request_id), 0, -1)]

    async def live_request_ids(self) -> list[str]:
        ids = sorted(m.decode() if isinstance(m, bytes) else m for m in await self._r.smembers(self._ops.live_key))
        pipe = self._r.pipeline(transaction=False)
        for request_id in ids:
            pipe.exists(self._ops.request_key(request_id))
        alive = await pipe.execute()
        gone = [i for i, ok in zip(ids, alive) if not ok]
        if gone:
            await self._r.srem(self._ops.live_key, *gone)
        return [i for i, ok in zip(ids, alive) if ok]

    async def delete_request(self, request_id: str) -> None:
        pipe = self._r.pipeline(transaction=True)
        self._ops.delete_request(pipe, request_id)
        await pipe.execute()

    async def commit_step(self, outcomes: Sequence[StepOutcome], now_ns: int | None = None) -> list[int]:
        if not outcomes:
            return []
        _check_outcomes(outcomes)
        now_ns = now_ns or _now_ns()
        for _ in range(2):
            if self._commit_sha is None:
                self._commit_sha = await self._r.script_load(_COMMIT_LUA)
            pipe = self._r.pipeline(transaction=False)
            for outcome in outcomes:
                self._ops.commit(pipe, self._commit_sha, outcome, now_ns)
            try:
                return [int(n) for n in await pipe.execute()]
            except NoScriptError:
                self._commit_sha = None
        raise RuntimeError("Redis keeps losing the commit script")

    async def commit(self, outcome: StepOutcome, now_ns: int | None = None) -> int:
        return (await self.commit_step([outcome], now_ns))[0]

    async def acceptance(self, scope: str = "global", name: str | None = None) -> AcceptanceStats:
        return _decode_stats(await self._r.hgetall(self._ops.stats_key(scope, name)))

    async def put_json(self, name: str, value: Any, ttl_s: int | None = None) -> None:
        await self._r.set(self._ops.blob_key(name), json.dumps(value), ex=ttl_s)

    async def get_json(self, name: str, default: Any = None) -> Any:
        raw = await self._r.get(self._ops.blob_key(name))
        return json.loads(raw) if raw is not None else default

    async def update_json(self, name: str, fn: Callable[[Any], Any], default: Any = None, retries: int = 64) -> Any:
        key = self._ops.blob_key(name)
        async with self._r.pipeline(transaction=True) as pipe:
            for attempt in range(retries):
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    value = fn(json.loads(raw) if raw is not None else default)
                    pipe.multi()
                    pipe.set(key, json.dumps(value))
                    await pipe.execute()
                    return value
                except WatchError:
                    await asyncio.sleep(_backoff_s(attempt))
        raise RuntimeError(f"update_json({name!r}) lost the race {retries} times")

    async def delete_json(self, name: str) -> None:
        await self._r.delete(self._ops.blob_key(name))
