"""The scheduler process: the public Tandem endpoint over the iteration loop and the two model services.

    running = await start(ServiceSettings.from_env(port=0))   # tests, the demo: returns once serving
    ...
    await running.stop()

    await serve(ServiceSettings.from_env())                   # `tandem serve scheduler`: until SIGINT/SIGTERM
    python -m services.scheduler.main                         # the same, configured by TANDEM_*

What ``start`` puts together::

    gRPC :port ── TandemServicer ── Scheduler ── TracedTarget ─ StepLedger ─ GrpcTargetWorker ──▶ target
       (+ health)                        │    └─ TracedDraft ─────────────── GrpcDraftWorker ───▶ draft
                                         └─ observers: RedisRecorder (Redis), MetricsObserver (/metrics),
                                                       RequestTracer (spans), PolicyStateSync (a learning
                                                       policy's state in Redis)

The target must answer Info within ``target_wait_s``: its vocabulary and
context window are what requests are checked against, and its model name,
device and dtype pick the profile that gives the tree policies their verify
budget B (``budget.py``: TANDEM_TOKEN_BUDGET, else the profile, else the
policies' default; logged at startup). The draft is optional
(``draft_addr`` "none" runs without one) and may come and go; the loop
degrades to plain decoding while it is away.
Without ``redis_url`` a private local Redis is started (and stopped with the
process); the launcher instead starts one and hands its URL to everybody.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc.aio
import redis.asyncio
from redis.exceptions import RedisError

import shared.rpc  # noqa: F401 - builds the generated code if needed
from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.target_link import TargetRecoveryConfig
from scheduler.step_pace import StepPace
from services.scheduler.grpc_workers import GrpcDraftWorker, GrpcTargetWorker
from services.scheduler.stream_workers import worker_classes
from services.scheduler.run_ahead import RunAhead
from scheduler.policies.elastic_memory import ElasticDraftMemory, ElasticMemoryConfig, PoolGrowth
from scheduler.policies.prefill_split import pair_cost
from scheduler.workers import RealClock
from services.version import service_version
from services.runtime import serve_until_stopped
from services.scheduler.budget import Budget, load_budget, load_draft_cost_model
from shared.rpc.convert import feature_spec_from_pb
from services.scheduler.internal_tls import follow_client_tls, follow_https
from services.scheduler.ledger import StepLedger
from services.scheduler.observers.metrics import MetricsObserver
from services.scheduler.observers.vllm_metrics import VllmMetricsObserver
from services.scheduler.observers.policy_state import PolicyStateSync
from services.scheduler.observers.redis_state import RedisRecorder
from services.scheduler.observers.tracing import RequestTracer, TracedDraft, TracedTarget
from services.scheduler.policies import queue_policy, speculation_policy
from services.scheduler.queue_gate import QueueGate
from services.scheduler.servicer import TandemServicer
from services.scheduler.text import TextCodec
from services.scheduler.timebase import Timebase
from services.scheduler.translate import Limits
from services.settings import ServiceSettings
from shared.engine.errors import ModelLoadError
from shared.metrics import TandemMetrics, start_http_server
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2_grpc
from shared.rpc.api_keys import ApiKeyInterceptor
from shared.rpc.shared_secret import secret_client_interceptors
from shared.rpc.tls import ClientTls, TlsConfigError
from shared.rpc.tls_mismatch import tls_problem
from shared.rpc.server import (
    PUBLIC_UNTRACED, TANDEM_SERVICE, add_health, bind, create_server, public_options, set_serving,
)
from shared.state.ownership import Heartbeat, fail_orphaned, new_instance_id
from shared.state.redis_server import start_redis
from shared.state.store import AsyncStateStore, StoreConfig
from shared.telemetry import TandemTracerProvider
from shared.event_loop import run_loop

log = logging.getLogger(__name__)

TARGET_WAIT_S = 600.0  # how long start() waits for the target's Info (it may still be loading its model)
NO_DRAFT = ("none", "off")  # TANDEM_DRAFT_ADDR values that mean "run without a draft"


@dataclass
class RunningScheduler:
    """A serving scheduler; ``stop()`` drains calls (up to the grace period), then frees everything."""

    port: int
    address: str
    scheduler: Scheduler
    servicer: TandemServicer
    recorder: RedisRecorder
    metrics: TandemMetrics
    tracer_provider: TandemTracerProvider
    server: grpc.aio.Server
    health: Any
    grace_s: float
    metrics_port: int | None = None
    http_port: int | None = None
    redis_url: str = ""
    budget: Budget | None = None  # B and the target's cost model (services.scheduler.budget)
    role: str = "scheduler"
    _closers: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    async def stop(self, grace_s: float | None = None) -> None:
        """NOT_SERVING, let in-flight calls finish (``grace_s``), then the loop, observers, workers, Redis."""
        await set_serving(self.health, [TANDEM_SERVICE], False)
        await self.server.stop(self.grace_s if grace_s is None else grace_s)
        await _close_all(self._closers)


async def start(
    settings: ServiceSettings, *, set_global_tracing: bool = False, target_wait_s: float = TARGET_WAIT_S
) -> RunningScheduler:
    """Connect to the model services, start the loop and serve the public endpoint; returns once serving."""
    closers: list[Callable[[], Any]] = []  # undo steps, run in reverse order
    try:
        return await _start(settings, closers, set_global_tracing, target_wait_s)
    except BaseException:
        await _close_all(closers)
        raise


async def _start(
    settings: ServiceSettings, closers: list[Callable[[], Any]], set_global_tracing: bool, target_wait_s: float
) -> RunningScheduler:
    public_tls = settings.public_tls()
    if public_tls is not None:
        public_tls.load()  # a bad certificate or key fails now, naming the file, not after the target answered
    internal_tls = settings.internal_client_tls()
    channel = internal_channel_args(internal_tls)  # checked now too
    provider = settings.tracing("scheduler").setup(set_global=set_global_tracing)
    closers.append(provider.shutdown)

    secret = settings.secret()  # the model services' shared secret, sent on every call to them (with TLS too)
    internal = secret_client_interceptors(secret) if secret else []  # unary calls and the step streams
    target_cls, draft_cls = worker_classes(settings.worker_protocol)
    target = target_cls(settings.target_addr, interceptors=internal, **channel)
    closers.append(target.close)
    draft_addr = None if (settings.draft_addr or "none").lower() in NO_DRAFT else settings.draft_addr
    draft = draft_cls(draft_addr, interceptors=internal, **channel) if draft_addr else None
    if draft is not None:
        closers.append(draft.close)
    elif settings.run_ahead and hasattr(target, "run_ahead"):  # every step a plain decode: the next goes ahead
        target.run_ahead = RunAhead(repeat=settings.plan_repeat, pace=_pace(settings))
    if internal_tls is not None:  # a renewed client certificate or CA reaches new calls without a restart
        follow = asyncio.get_running_loop().create_task(
            follow_client_tls(internal_tls, [w for w in (target, draft) if w is not None]), name="internal-tls")
        closers.append(lambda: _cancel(follow))
    target_info = await _target_info(target, target_wait_s, settings.target_addr)
    limits = Limits(
        vocab_size=target_info.vocab_size, max_context=target_info.max_context,
        max_prompt_bytes=settings.max_prompt_bytes, max_prompt_tokens=settings.max_prompt_tokens,
        max_new_tokens=settings.max_new_tokens, max_stop_strings=settings.max_stop_strings,
        max_stop_chars=settings.max_stop_chars, max_stop_token_ids=settings.max_stop_token_ids,
    )
    codec = await asyncio.to_thread(_text_codec, settings)

    redis_url = settings.redis_url
    if redis_url is None:
        redis_server = await asyncio.to_thread(start_redis)
        closers.append(redis_server.stop)
        redis_url = redis_server.url
        log.info("no redis_url configured: started a private Redis at %s", redis_url)

    store = AsyncStateStore(StoreConfig(url=redis_url), client=_redis_client(redis_url))
    budget = await load_budget(settings, target_info, store)
    log.info("%s", budget.describe())

    draft_info = await _draft_info(draft, draft_addr) if draft is not None else None
    draft_cost = await asyncio.to_thread(load_draft_cost_model, settings, draft_info) if draft_info else None
    if draft_info is not None and draft_info.HasField("feature_spec"):
        problem = feature_mismatch(draft_info, target_info)
        if problem:
            log.error("the draft cannot serve this target (%s); serving without speculation", problem)
            draft = None
        else:
            draft.feature_spec = feature_spec_from_pb(draft_info.feature_spec)
            if settings.feature_path == "direct" and hasattr(target, "push_features_to"):
                target.push_features_to = draft_addr  # step streams: the target sends the draft its rows itself
            log.info("feature-level draft: target features of layers %s travel as %s (%d values per token)",
                     list(draft.feature_spec.layer_ids), draft.feature_spec.dtype, draft_info.feature_width)  # fmt: skip
    spec_policy = speculation_policy(settings.speculation_policy)
    relay = settings.draft_relay and draft is not None and getattr(draft, "feature_spec", None) is None \
        and hasattr(target, "relay_to")  # fmt: skip
    if relay:
        target.relay_to = draft_addr  # the target hands the draft its tokens and verifies the trees it answers
    clock = RealClock()
    tracer = RequestTracer(provider)
    ledger = StepLedger(target, clock)
    draft_memory = draft_memory_config(settings.draft_offload) if draft is not None else None
    scheduler = Scheduler(
        TracedTarget(ledger, tracer),
        TracedDraft(draft, tracer) if draft is not None else None,
        config=SchedulerConfig(
            max_batch_size=settings.max_batch_size,
            max_tokens_in_flight=kv_token_budget(target_info, SchedulerConfig(max_batch_size=settings.max_batch_size)),
            token_budget=budget.token_budget,
            cost_model=budget.cost_model,
            draft_cost_model=draft_cost,
            draft_memory=draft_memory,
            pool_growth=pool_growth(target_info) if draft_memory is not None else None,
            frontier=_frontier(settings, draft is not None, budget.cost_model, draft_cost),
            draft_ahead=settings.draft_ahead and settings.worker_protocol == "stream",
            draft_relay=relay,
            target_recovery=TargetRecoveryConfig(recovery_s=settings.target_recovery_s),
            prefill_pair_cost=pair_cost(target_info.attention_width, target_info.num_layers, target_info.layer_params),
        ),
        clock=clock,
        spec_policy=spec_policy,
        queue_policy=queue_policy(settings.queue_policy, cost_model=budget.cost_model, draft_cost_model=draft_cost),
        detokenize=codec.decode if codec else None,
    )
    if scheduler.verify_ahead is not None and relay:  # relayed over step streams: a plan may run several steps
        scheduler.verify_ahead.repeat, scheduler.verify_ahead.pace = settings.plan_repeat, _pace(settings)
    levels = getattr(getattr(scheduler.queue_policy, "config", None), "levels", None)
    if levels is not None:  # LAPS-SD's queues (services/scheduler/policies.py)
        log.info("queue policy %s: %d queues, %s, M = %g", scheduler.queue_policy.name,
                 levels.num_queues, levels.describe(), levels.growth)  # fmt: skip
    instance = new_instance_id()
    heartbeat = Heartbeat(store, instance)
    await heartbeat.start()
    try:  # requests an earlier, dead process left "running" end as failed
        await fail_orphaned(store, instance)
    except (RedisError, OSError) as exc:
        log.warning("could not check Redis for requests of a stopped scheduler: %s", exc)
    recorder = RedisRecorder(store, Timebase(clock), policy_name=spec_policy.name, owner=instance)
    closers.append(recorder.close)
    closers.append(heartbeat.stop)  # runs before the recorder closes the store
    metrics = TandemMetrics()
    vllm_names = VllmMetricsObserver(metrics.registry, scheduler, target_info.model_name)  # what routers scrape
    for observer in (recorder, MetricsObserver(metrics, scheduler), vllm_names, tracer):
        scheduler.add_observer(observer)
    for learned in (spec_policy.shared_state(), scheduler.queue_policy.shared_state()):
        if learned is not None:  # what a policy learned lives in Redis, shared with other replicas
            policy_sync = PolicyStateSync(store, learned)  # closed before the recorder closes the store
            await policy_sync.load()
            scheduler.add_observer(policy_sync)
            closers.append(policy_sync.close)

    metrics_port = None
    if settings.metrics_port is not None:
        http, _ = start_http_server(settings.metrics_port, metrics.registry, addr=settings.host)
        closers.append(http.shutdown)
        metrics_port = http.server_port

    loop_task = asyncio.get_running_loop().create_task(scheduler.run(), name="scheduler-loop")

    async def stop_loop() -> None:
        scheduler.stop()
        await asyncio.gather(loop_task, return_exceptions=True)

    closers.append(stop_loop)

    servicer = TandemServicer(
        scheduler,
        ledger,
        limits,
        codec,
        version=service_version(),
        target_info=target.info,
        draft_info=draft.info if draft is not None else None,
        gate=QueueGate(settings.max_queue),
    )
    keys = settings.api_key_set()  # the public endpoint's API keys; none = open
    server = create_server(tracer_provider=provider, options=public_options(settings.max_prompt_bytes),
                           interceptors=[ApiKeyInterceptor(keys)] if keys else [], untraced_methods=PUBLIC_UNTRACED)
    tandem_pb2_grpc.add_TandemServicer_to_server(servicer, server)
    health = await add_health(server, [TANDEM_SERVICE])
    port = bind(server, settings.listen_address("scheduler"), tls=public_tls)
    closers.append(lambda: server.stop(None))  # only reached when start() fails from here on
    await server.start()
    closers.pop()
    http_port = None
    if settings.http_port is not None:  # the OpenAI-compatible API, in this process (http_api.py)
        http_port = await _start_http(settings, servicer, target_info.model_name, keys, closers, metrics)

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "[::]", "") else settings.host
    address = f"{host}:{port}"  # where clients on this machine dial it
    log.info(
        "scheduler serving on %s (target %s, draft %s, policy %s, redis %s, metrics :%s)",
        address, settings.target_addr, draft_addr or "none", spec_policy.name, redis_url, metrics_port,
    )  # fmt: skip
    return RunningScheduler(
        port=port,
        address=address,
        scheduler=scheduler,
        servicer=servicer,
        recorder=recorder,
        metrics=metrics,
        tracer_provider=provider,
        server=server,
        health=health,
        grace_s=settings.shutdown_grace_s,
        metrics_port=metrics_port,
        http_port=http_port,
        redis_url=redis_url,
        budget=budget,
        _closers=list(closers),
    )


async def _start_http(settings: ServiceSettings, servicer, model_name: str, keys, closers, metrics) -> int:
    import uvicorn

    from services.scheduler.http_api import build_app

    # the model's directory or repo id and its last part also name it (clients send either)
    aliases = [settings.model, Path(str(settings.model)).name, "tandem"] if settings.model else ["tandem"]
    app = build_app(servicer, model_name=model_name, keys=keys, aliases=aliases, metrics=metrics.exposition)
    tls = settings.public_tls()  # HTTPS with the gRPC endpoint's certificate, renewed with it (follow_https)
    config = uvicorn.Config(app, host=settings.host, port=settings.http_port, log_level="warning", lifespan="off",
                            access_log=False, ssl_certfile=tls and str(tls.cert), ssl_keyfile=tls and str(tls.key))  # fmt: skip
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # the scheduler's own handlers stop everything
    task = asyncio.get_running_loop().create_task(server.serve(), name="http-api")

    async def stop() -> None:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)

    closers.append(stop)
    while not server.started:
        if task.done():
            raise RuntimeError(f"the HTTP API did not start on port {settings.http_port}: {task.exception()}")
        await asyncio.sleep(0.01)
    if tls is not None:  # a renewed certificate reaches new HTTPS connections
        follow = asyncio.get_running_loop().create_task(follow_https(tls, config.ssl), name="https-certificate")
        closers.append(lambda: _cancel(follow))
    port = server.servers[0].sockets[0].getsockname()[1]
    log.info("OpenAI-compatible HTTP API on %s://%s:%d", "https" if tls else "http", settings.host, port)
    return port


async def serve(settings: ServiceSettings, *, ready: asyncio.Event | None = None, freeze_gc: bool = False) -> None:
    """Serve until cancelled or SIGTERM/SIGINT, then drain for ``shutdown_grace_s``; ``ready`` is set once SERVING;
    ``freeze_gc``: the process's own entry point (shared/gc_freeze.py)."""
    await serve_until_stopped(start(settings, set_global_tracing=True), ready=ready, freeze_gc=freeze_gc)


def _pace(settings: ServiceSettings) -> StepPace:
    """How many continuation steps a plan asks for, from the step time (scheduler/step_pace.py)."""
    return StepPace(settings.plan_repeat, settings.repeat_wait_ms / 1e3)


def internal_channel_args(tls: ClientTls | None) -> dict[str, Any]:
    """GrpcTargetWorker/GrpcDraftWorker keywords for dialling the model services (TLS with ``tls``; its
    files are checked here: TlsConfigError naming the file)."""
    return {} if tls is None else {"credentials": tls.credentials(), "channel_options": tls.options()}


async def _target_info(target: GrpcTargetWorker, wait_s: float, address: str = "") -> common_pb2.ServiceInfo:
    """The target's Info (vocabulary, context window, KV cache); waits while it is still loading, fails at once
    on a TLS mismatch (naming it: one side speaks TLS, the other not, or the certificate is not trusted)."""
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        try:
            return await target.info()
        except grpc.aio.AioRpcError as exc:
            problem = await asyncio.to_thread(tls_problem, address, tls=target.tls, details=exc.details() or "")
            if problem:
                raise TlsConfigError(f"the target service at {address}: {problem}") from None
            if time.monotonic() >= deadline:
                raise RuntimeError(f"the target service did not answer Info within {wait_s:.0f} s: {exc.details()}")
            if not waited:
                log.info("waiting for the target service (%s)", exc.code().name)
                waited = True
            await asyncio.sleep(0.5)


async def _draft_info(draft: GrpcDraftWorker, address: str = "") -> common_pb2.ServiceInfo | None:
    """The draft's Info (its cost profile's key, the features it reads), when it answers now; else None."""
    try:
        return await draft.info(wait_s=10.0)  # started together (tandem up): give it time to come up
    except Exception as exc:  # noqa: BLE001 - the draft may come later; the policies then learn its cost online
        details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else ""
        problem = await asyncio.to_thread(tls_problem, address, tls=draft.tls, details=details or "")
        if problem:
            log.error("the draft service at %s: %s; serving without speculation until it answers", address, problem)
        log.info("no draft cost model (draft Info: %s); policies measure the draft online", exc)
        return None


def feature_mismatch(draft: common_pb2.ServiceInfo, target: common_pb2.ServiceInfo) -> str | None:
    """Why a feature-level draft cannot read this target's features, or None when it can."""
    layers = list(draft.feature_spec.layer_ids)
    if target.num_layers and any(i > target.num_layers for i in layers):
        return f"it reads layers {layers}, the target has {target.num_layers}"
    if target.hidden_size and draft.feature_width != len(layers) * target.hidden_size:
        return (
            f"it reads rows of {draft.feature_width} values, the target's are {len(layers)} x {target.hidden_size}"
        )
    if draft.vocab_size and target.vocab_size and draft.vocab_size != target.vocab_size:
        return f"its vocabulary has {draft.vocab_size} tokens, the target's {target.vocab_size}"
    return None


def kv_token_budget(info: common_pb2.ServiceInfo, config: SchedulerConfig, max_spec_k: int = 32) -> int:
    """Tokens the loop may reserve so that the target's KV cache never runs out mid-generation.

    Admission reserves prompt + max_new_tokens per request (scheduler.policies.queue);
    on top of that each running request may hold a partly filled last block and up
    to ``max_spec_k`` speculative tokens during a verify, so those are set aside.
    """
    # the start-up pool (draft resident): a pool still grown from an earlier offload is not counted on
    total = (info.kv_blocks_base or info.kv_blocks_total) * info.block_size
    if total == 0:  # a target that does not report its cache: keep the configured budget
        return config.max_tokens_in_flight
    spare = config.max_batch_size * (info.block_size + max_spec_k)
    return max(1, min(config.max_tokens_in_flight, total - spare))


def pool_growth(info: common_pb2.ServiceInfo) -> PoolGrowth | None:
    """How far the target's KV pool may grow while the draft is offloaded (TANDEM_KV_GROW_BLOCKS); None = fixed."""
    base = info.kv_blocks_base or info.kv_blocks_total
    if info.kv_blocks_max <= base or info.block_size == 0:
        return None
    growth = PoolGrowth(base_blocks=base, extra_blocks=info.kv_blocks_max - base, block_size=info.block_size)
    log.info(
        "elastic memory: the target's KV pool grows %d -> %d blocks (+%d tokens of budget) while the draft is offloaded",
        base, info.kv_blocks_max, growth.extra_tokens,
    )  # fmt: skip
    return growth


_OFFLOAD_OPTIONS = {"low": "low_free", "high": "high_free", "persist": "persist_steps"}


def draft_memory_config(spec: str) -> ElasticMemoryConfig | None:
    """TANDEM_DRAFT_OFFLOAD: ``off`` (None), ``on`` (defaults) or ``low=0.1,high=0.3,persist=8``."""
    spec = spec.strip().lower()
    if spec in ("", "off", "0", "false", "no"):
        return None
    if spec in ("on", "1", "true", "yes"):
        return ElasticMemoryConfig()
    values: dict[str, float] = {}
    for part in spec.split(","):
        key, eq, text = part.partition("=")
        if not eq or key.strip() not in _OFFLOAD_OPTIONS:
            raise ValueError(f"draft offload options are off, on or {', '.join(f'{k}=' for k in _OFFLOAD_OPTIONS)}")
        values[_OFFLOAD_OPTIONS[key.strip()]] = float(text)
    config = ElasticMemoryConfig(**values)
    ElasticDraftMemory(config)  # τ_high > τ_low
    return config


def _frontier(settings: ServiceSettings, has_draft: bool, target_cost, draft_cost):
    """TANDEM_FRONTIER as the loop's FrontierConfig; logs when it cannot take effect."""
    config = settings.frontier_config()
    if config is None:
        return None
    if not has_draft:
        log.warning("frontier pipelining is on but there is no draft: every request decodes plainly")
    elif config.chunk_size is None and (target_cost is None or draft_cost is None):
        # choose_chunk needs both cost models to pick s_c; without them the measured gate decides on a fixed chunk
        if config.measured:
            log.info(
                "frontier pipelining on without a %s cost model: chunks of %d, pipelined where both modes' measured "
                "token rates say it pays (%s)", "target" if target_cost is None else "draft", config.unmodelled_chunk,
                config,
            )  # fmt: skip
        else:
            log.warning(
                "frontier pipelining is on without a %s cost model, without chunk=N and without the measured gate: "
                "steps run serially; profile both models (`tandem profile`) or set TANDEM_FRONTIER=chunk=N",
                "target" if target_cost is None else "draft",
            )  # fmt: skip
    else:
        log.info("frontier pipelining on (%s)", config)
    return config


def _text_codec(settings: ServiceSettings) -> TextCodec | None:
    """The tokenizer of the target model, read from its directory (the scheduler loads no weights)."""
    try:
        path = settings.model_path("target")
    except ModelLoadError as exc:
        log.warning("no tokenizer (%s): serving token-id prompts only", exc)
        return None
    return TextCodec.load(path if path.is_dir() else path.parent)


def _redis_client(url: str) -> redis.asyncio.Redis:
    # short timeouts: a Redis outage must cost the recorder a logged error, not a hung writer
    return redis.asyncio.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=2.0)


async def _cancel(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _close_all(closers: list[Callable[[], Any]]) -> None:
    while closers:
        close = closers.pop()
        try:
            out = close()
            if inspect.isawaitable(out):
                await out
        except Exception:  # noqa: BLE001 - shut the rest down regardless
            log.exception("scheduler shutdown step %r failed", close)


if __name__ == "__main__":
    settings = ServiceSettings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_loop(serve(settings, freeze_gc=True))
