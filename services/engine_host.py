"""One engine behind an async front: calls run one at a time, off the event loop.

The engines are blocking torch code and not thread-safe. The servicers hand
every engine call to ``EngineHost.run``::

    RPC ─▶ await the lock (queue_ns) ─▶ the host's single engine thread: engine call (work_ns) ─▶ response

so the event loop stays free to answer health checks and to accept (and
queue) more calls while a forward runs.

The engine is a model (TargetEngine, DraftEngine over a ModelRunner with a
paged KV cache) or, for the draft, a model-free one: prompt lookup
(NgramDraftEngine over a TokenStore) or suffix trees (SuffixDraftEngine over a
SuffixStore); no weights, no KV cache, so Info reports 0 KV blocks, dtype
"none" and device "cpu". The lock orders calls by arrival and
measures how long each waited; the single thread is what actually keeps two
engine calls from ever overlapping, even when a caller gives up (cancels)
while its call still runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import shared.rpc  # noqa: F401 - builds the generated code if needed
from services.settings import ServiceSettings, ngram_name, suffix_name
from services.spans import annotate
from services.version import service_version
from shared.engine.draft_engine import DraftEngine
from shared.engine.early_exit import EarlyExitConfig
from shared.engine.eagle.loading import is_eagle_dir
from shared.engine.errors import ModelLoadError
from shared.engine.factory import (
    build_draft_engine,
    build_feature_draft_engine,
    build_ngram_draft_engine,
    build_suffix_draft_engine,
    build_target_engine,
)
from shared.engine.loading import LoadedModel
from shared.engine.model_shape import model_shape
from shared.engine.ngram_drafter import NgramDraftEngine
from shared.engine.suffix_drafter import SuffixDraftEngine
from shared.engine.target_engine import TargetEngine
from shared.rpc.convert import CallTimer, feature_spec_to_pb
from shared.rpc.gen.tandem.v1 import common_pb2
from shared.rpc.shared_rows import host_id

T = TypeVar("T")
_HOST_ID = host_id()  # this host and its /dev/shm (Info's shared_memory_host)
log = logging.getLogger(__name__)


def engine_thread(role: str) -> ThreadPoolExecutor:
    """The one thread that loads a service's engine and runs every call on it."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tandem-{role}-engine")


@dataclass
class Ran(Generic[T]):
    """An engine call's result and where its time went."""

    result: T
    queue_ns: int  # waiting behind earlier calls
    work_ns: int  # on the engine thread

    def timing(self, timer: CallTimer, forward_ns: int = 0) -> common_pb2.Timing:
        """The response Timing: what was not forward pass on the engine thread counts as sampling."""
        return timer.timing(queue_ns=self.queue_ns, forward_ns=forward_ns, sample_ns=max(0, self.work_ns - forward_ns))


class EngineHost:
    def __init__(
        self,
        engine: TargetEngine | DraftEngine | NgramDraftEngine | SuffixDraftEngine,
        loaded: LoadedModel | None,
        role: str,
        *,
        model_name: str | None = None,
        thread: ThreadPoolExecutor | None = None,
    ) -> None:
        """``loaded`` is None for a model-free engine, which then needs ``model_name``."""
        self.engine = engine
        self.loaded = loaded
        self.role = role
        self.model_name = model_name or (loaded.name if loaded is not None else type(engine).__name__)
        self._lock = asyncio.Lock()
        self._thread = thread or engine_thread(role)
        self.inline_steps = steps_inline(engine, loaded)  # step streams call the engine on the event loop
        self.metrics = None  # services.engine_metrics.EngineMetrics when the service exports metrics
        self.release_hooks: list[Callable[[list[str]], None]] = []  # told of every release (the draft's lookaheads)

    @classmethod
    async def load(cls, settings: ServiceSettings, role: Literal["target", "draft"]) -> EngineHost:
        """Build the role's engine from ``settings`` on the thread that will run it (seconds to minutes).

        Loading on the engine thread itself, not on asyncio's default executor, keeps every parallel
        torch region of the process on one thread: libgomp gives each thread that starts a parallel
        region its own team, and once a process holds more OpenMP threads than CPUs it cuts the spin
        wait between regions to ~100 iterations. A forward is thousands of small regions, so a
        second team (from a load on another thread) made every decode ~1.7x slower on 2 cores
        (33 ms -> 58 ms for SmolLM2-135M at batch 1; tests/services/test_engine_thread.py)."""
        thread = engine_thread(role)
        try:
            built = await asyncio.get_running_loop().run_in_executor(thread, cls._build, settings, role)
        except BaseException:
            thread.shutdown(wait=True)  # idle: the load ended; no thread outlives a failed start
            raise
        engine, loaded, model_name = built
        return cls(engine, loaded, role, model_name=model_name, thread=thread)

    @staticmethod
    def _build(settings: ServiceSettings, role: str) -> tuple[object, LoadedModel | None, str | None]:
        """(engine, loaded model or None, model name for a model-free engine): runs on the engine thread."""
        if settings.threads is not None:  # TANDEM_THREADS: the launcher's CPU split (FASER §4.4 fallback)
            import torch

            torch.set_num_threads(settings.threads)  # process-wide: the engine thread's pool follows it
            log.info("%s: torch uses %d threads", role, settings.threads)
        ngram = settings.ngram(role)  # raises for a malformed spec or an ngram target
        if ngram is not None:
            return build_ngram_draft_engine(*ngram, vocab_size=settings.vocab_size), None, ngram_name(*ngram)
        suffix = settings.suffix(role)  # the same for suffix:KEY=VALUE,...
        if suffix is not None:
            return build_suffix_draft_engine(suffix, vocab_size=settings.vocab_size), None, suffix_name(suffix)
        build = build_target_engine if role == "target" else build_draft_engine
        engine_config = settings.engine_config()
        if role == "draft":  # only the target's pool grows into the draft's space (TANDEM_KV_GROW_BLOCKS)
            engine_config = engine_config.model_copy(update={"kv_grow_blocks": 0})
            path = settings.model_path(role)
            if is_eagle_dir(path):
                return EngineHost._load_feature_draft(settings, path, engine_config)
        engine, loaded = build(
            settings.model_path(role),
            device=settings.device,
            dtype=settings.dtype,
            engine_config=engine_config,
            with_tokenizer=False,  # the services see token ids only
        )
        if role == "target":
            engine.set_early_exit(EngineHost._early_exit_with_profile(settings, engine, loaded), loaded.source)
            lens = engine.runner.exit_lens
            if lens is not None:
                vocab = "the whole vocabulary" if lens.vocab is None else f"{lens.vocab.numel()} tokens"
                log.info("early exit: tuned lens at layers %s, ranking within %s", lens.layers, vocab)
        return engine, loaded, None

    @staticmethod
    def _early_exit_with_profile(settings: ServiceSettings, engine, loaded: LoadedModel) -> EarlyExitConfig | None:
        """Early exit's settings with the target's marginal per-token cost (its profile's gamma), when it is profiled
        on this device type and dtype: eq. 9 of FASER prices a pruned row at that slope (early_exit.py)."""
        config = settings.early_exit_config()
        if config is None or not config.enabled or config.token_cost_s is not None:
            return config
        from types import SimpleNamespace

        from services.scheduler.budget import profile_from_files

        runner = engine.runner
        info = SimpleNamespace(model_name=loaded.name, device=str(runner.device),
                               dtype=str(runner.dtype).removeprefix("torch."),
                               cpu_threads=cpu_threads() if str(runner.device).startswith("cpu") else 0)  # fmt: skip
        try:
            profile, where = profile_from_files(settings, info)
        except (OSError, ValueError) as exc:
            log.warning("early exit: no target profile (%s); the per-token cost is fitted online", exc)
            return config
        if profile is None:
            log.info("early exit: no target profile; the per-token cost is fitted online")
            return config
        gamma = profile.cost_model.gamma_s
        log.info("early exit: per-token cost %.3g ms from %s", gamma * 1e3, where)
        return config.model_copy(update={"token_cost_s": gamma})

    @staticmethod
    def _load_feature_draft(settings: ServiceSettings, head_dir, engine_config) -> tuple[object, LoadedModel, None]:
        """An EAGLE-3 head: its sizes are checked against the target's config, whose embedding it may borrow."""
        try:
            target_dir = settings.model_copy(update={"model": settings.target_model}).model_path("target")
        except ModelLoadError:
            target_dir = None  # fine when the head carries its embedding; load_head says so otherwise
        engine = build_feature_draft_engine(
            head_dir,
            target_dir=target_dir,
            device=settings.device,
            dtype=settings.dtype,
            engine_config=engine_config,
            feature_dtype=settings.feature_dtype,
        )
        runner = engine.runner
        loaded = LoadedModel(
            model=runner.head,
            tokenizer=None,
            name=head_dir.name,
            dtype=runner.dtype,
            device=runner.device,
            vocab_size=runner.vocab_size,
            max_context=runner.max_context,
            source=head_dir,
        )
        return engine, loaded, None

    async def run(self, fn: Callable[..., T], *args: object) -> Ran[T]:
        """``fn(*args)`` on the engine thread, after every call that arrived earlier."""
        arrived = time.perf_counter_ns()
        async with self._lock:
            started = time.perf_counter_ns()
            result = await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        return self._ran(fn, args, result, arrived, started)

    async def run_step(self, fn: Callable[..., T], *args: object) -> Ran[T]:
        """A step stream's engine call: ``fn(*args)`` on the event loop itself where ``inline_steps``, else ``run``.

        The hop to the engine thread and back costs two thread wake-ups, 0.1-0.3 ms per call on a
        2-core host (bench.grpc_floor), as much as the transport itself. Inline, the call still waits
        behind every earlier call (the same lock), and Info and health wait behind at most this one."""
        if not self.inline_steps:
            return await self.run(fn, *args)
        arrived = time.perf_counter_ns()
        async with self._lock:
            started = time.perf_counter_ns()
            result = fn(*args)
        return self._ran(fn, args, result, arrived, started)

    def _ran(self, fn, args, result, arrived: int, started: int) -> Ran:
        ran = Ran(result, queue_ns=started - arrived, work_ns=time.perf_counter_ns() - started)
        if self.metrics is not None:
            self.metrics.observe_call(fn, args, ran.queue_ns, ran.work_ns, result)
        annotate(engine_queue_ms=ran.queue_ns / 1e6, engine_work_ms=ran.work_ns / 1e6)  # on the call's server span
        return ran

    async def release(self, request: common_pb2.ReleaseRequest) -> common_pb2.ReleaseResponse:
        """The Release RPC of both services: ids the engine does not hold are ignored (idempotent)."""
        timer = CallTimer()
        ran = await self.run(self._release_live, list(request.seq_ids))
        num_released, blocks_free = ran.result
        annotate(num_released=num_released, kv_blocks_free=blocks_free)
        return common_pb2.ReleaseResponse(
            num_released=num_released, kv_blocks_free=blocks_free, timing=ran.timing(timer)
        )

    def _release_live(self, seq_ids: list[str]) -> tuple[int, int]:
        for hook in self.release_hooks:
            hook(seq_ids)
        live = [s for s in dict.fromkeys(seq_ids) if s in self.engine.runner.seqs]
        self.engine.release(live)
        cache = self.kv_cache
        return len(live), cache.num_free_blocks if cache is not None else 0

    @property
    def kv_cache(self):
        """The engine's paged KV cache; None for a model-free engine, which holds tokens only."""
        return getattr(self.engine.runner, "cache", None)

    def describe(self) -> str:
        """One line for the startup log: what is served, where, and its KV cache."""
        if self.loaded is None:
            return f"{self.model_name} (model-free, no KV cache)"
        loaded = self.loaded
        return f"{loaded.source} ({loaded.dtype}, {loaded.device}, {self.kv_cache.num_blocks} KV blocks)"

    def info(self) -> common_pb2.ServiceInfo:
        """A snapshot of model and KV occupancy; read without the lock, so Info never waits behind a forward."""
        runner = self.engine.runner
        info = common_pb2.ServiceInfo(
            role=self.role,
            service_version=service_version(),
            model_name=self.model_name,
            vocab_size=runner.vocab_size or 0,  # 0: a model-free draft told no vocabulary (TANDEM_VOCAB_SIZE)
            num_live_seqs=len(runner.seqs),
            weights_offloaded=bool(getattr(self.engine, "offloaded", False)),
            shared_memory_host=_HOST_ID,  # a target on this host pushes feature rows through shared memory
            relay_port=getattr(self, "relay_port", 0),  # a draft's relay socket (services/draft/relay_socket.py)
        )
        cache = self.kv_cache
        if cache is None:  # model-free: no weights, no context limit, no KV blocks (the fields stay 0)
            info.dtype, info.device = "none", "cpu"
            return info
        info.max_context = runner.max_context
        info.dtype = str(runner.dtype).removeprefix("torch.")
        info.device = str(runner.device)
        if runner.device.type == "cpu":
            info.cpu_threads = cpu_threads()
        info.kv_blocks_total = cache.num_blocks
        info.kv_blocks_base, info.kv_blocks_max = runner.base_blocks, runner.max_blocks
        info.kv_blocks_free = cache.num_free_blocks  # 0 while offloaded: the pool's memory is given back
        info.block_size = cache.block_size
        index = cache.allocator.prefix  # automatic prefix caching (shared/engine/prefix_cache.py)
        info.prefix_cache_blocks, info.prefix_cache_evictions = cache.allocator.num_cached, index.evictions
        info.prefix_cache_query_tokens, info.prefix_cache_hit_tokens = index.queries, index.hits
        spec = getattr(self.engine, "spec", None)  # a feature-level draft: what it reads of the target
        if spec is not None:
            info.feature_spec.CopyFrom(feature_spec_to_pb(spec))
            info.feature_width = runner.feature_width
        if self.role == "target":
            cfg = runner.model.config
            info.hidden_size = cfg.hidden_size
            info.num_layers = cfg.num_hidden_layers
            shape = model_shape(runner)
            info.attention_width, info.layer_params = shape.attention_width, shape.layer_params
        return info

    def close(self) -> None:
        """Stop the engine thread once its current call (if any) ends; then what the servicers hold (``closers``)."""
        self._thread.shutdown(wait=False, cancel_futures=True)
        for close in getattr(self, "closers", ()):
            close()


def steps_inline(engine, loaded: LoadedModel | None) -> bool:
    """Whether a step stream may call this engine on the event loop thread instead of the engine thread.

    The engine thread exists for two reasons: the event loop stays free during a long CPU forward,
    and every parallel torch region runs on one thread (one OpenMP team; see ``EngineHost.load``).
    Neither holds for a model-free engine (pure Python), an engine on an accelerator (a step is a
    few milliseconds of host work launching kernels), or a CPU engine on one torch thread (no team)."""
    if loaded is None:
        return True
    device = getattr(getattr(engine, "runner", None), "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        return True
    return cpu_threads() == 1


def cpu_threads() -> int:
    """The torch CPU threads this process runs its models with (TANDEM_THREADS, else torch's choice)."""
    import torch

    return torch.get_num_threads()
