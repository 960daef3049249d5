"""The public servicer over toy fake workers, served on loopback: real gRPC, no models.

    with fake_stack(codec=None, redis_url=None) as stack:   # stack.address, .lm, .target, .recorder ...

The toy target is the greedy ``ToyLM`` of scheduler.testing, so "what would
the target alone say" is ``lm.generate(prompt, n)``; a little verify latency
makes concurrent requests share steps.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc.aio

from scheduler.engine_loop import Scheduler, SchedulerConfig
from scheduler.policies.speculation import FixedChain, SpeculationPolicy
from scheduler.testing import FakeDraft, FakeTarget, ToyDraftLM, ToyLM
from scheduler.workers import RealClock
from services.scheduler.ledger import StepLedger
from services.scheduler.queue_gate import QueueGate
from services.scheduler.observers.metrics import MetricsObserver
from services.scheduler.observers.vllm_metrics import VllmMetricsObserver
from services.scheduler.observers.redis_state import RedisRecorder
from services.scheduler.observers.tracing import RequestTracer, TracedDraft, TracedTarget
from services.scheduler.servicer import TandemServicer
from services.scheduler.text import TextCodec
from services.scheduler.timebase import Timebase
from services.scheduler.translate import Limits
from shared.metrics import TandemMetrics
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2_grpc
from shared.rpc.server import TANDEM_SERVICE, add_health, bind, create_server
from shared.state.store import AsyncStateStore, StoreConfig
from shared.telemetry import TandemTracerProvider, setup_tracing
from tests.support.loop_thread import LoopThread

VOCAB = 50
MAX_CONTEXT = 256


CHARS = "abcdefghijklmnopqrstuvwxyz." + "".join(chr(0x4E00 + i) for i in range(VOCAB - 27))
EOS = 26  # "."


class CharTokenizer:
    """A stand-in for a Hugging Face tokenizer: one token per character of ``CHARS``, "." is EOS."""

    eos_token_id = EOS
    alphabet = CHARS

    chat_template = "toy: each message's content, then the generation prompt ':'"

    def __call__(self, text: str, **_: object) -> dict[str, list[int]]:
        return {"input_ids": [self.alphabet.index(c) for c in text if c in self.alphabet]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **variables) -> list[int]:
        text = "".join(str(m["content"]) for m in messages) + (":" if add_generation_prompt else "")
        return self(text)["input_ids"]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.alphabet[i] for i in ids)


@dataclass
class FakeStack:
    address: str
    scheduler: Scheduler
    target: FakeTarget
    draft: FakeDraft
    lm: ToyLM
    metrics: TandemMetrics
    tracer_provider: TandemTracerProvider
    recorder: RedisRecorder | None
    loop: LoopThread
    server: grpc.aio.Server | None = None
    task: asyncio.Task | None = None
    servicer: TandemServicer | None = None


async def _serve(
    stack: FakeStack, codec: TextCodec | None, redis_url: str | None, limits: Limits | None,
    max_queue: int | None, config: SchedulerConfig | None, spec_policy: SpeculationPolicy | None = None,
) -> None:
    clock = RealClock()
    tracer = RequestTracer(stack.tracer_provider)
    ledger = StepLedger(stack.target, clock)
    scheduler = Scheduler(
        TracedTarget(ledger, tracer),
        TracedDraft(stack.draft, tracer),
        clock=clock,
        spec_policy=spec_policy or FixedChain(2),
        detokenize=codec.decode if codec else None,
        config=config or SchedulerConfig(),
    )
    scheduler.add_observer(MetricsObserver(stack.metrics, scheduler))
    scheduler.add_observer(VllmMetricsObserver(stack.metrics.registry, scheduler, "toy"))
    scheduler.add_observer(tracer)
    if redis_url is not None:
        store = AsyncStateStore(StoreConfig(url=redis_url, namespace=f"test-{uuid.uuid4().hex[:8]}"))
        stack.recorder = RedisRecorder(store, Timebase(clock), policy_name="fixed_chain")
        scheduler.add_observer(stack.recorder)

    async def target_info() -> common_pb2.ServiceInfo:
        return common_pb2.ServiceInfo(role="target", model_name="toy", vocab_size=VOCAB, max_context=MAX_CONTEXT)

    servicer = TandemServicer(
        scheduler, ledger, limits or Limits(VOCAB, MAX_CONTEXT), codec, version="test", target_info=target_info,
        gate=QueueGate(max_queue) if max_queue else None,
    )
    server = create_server(tracer_provider=stack.tracer_provider)
    tandem_pb2_grpc.add_TandemServicer_to_server(servicer, server)
    await add_health(server, [TANDEM_SERVICE])
    stack.address = f"127.0.0.1:{bind(server, '127.0.0.1:0')}"
    await server.start()
    stack.scheduler, stack.server, stack.servicer = scheduler, server, servicer
    stack.task = asyncio.get_running_loop().create_task(scheduler.run())


async def _stop(stack: FakeStack) -> None:
    await stack.server.stop(None)
    stack.scheduler.stop()
    await stack.task
    if stack.recorder is not None:
        await stack.recorder.close()


@contextmanager
def fake_stack(
    codec: TextCodec | None = None,
    redis_url: str | None = None,
    *,
    limits: Limits | None = None,
    max_queue: int | None = None,
    config: SchedulerConfig | None = None,
    spec_policy: SpeculationPolicy | None = None,
) -> Iterator[FakeStack]:
    """Serve the public endpoint over fake workers (and record to Redis when ``redis_url`` is given);
    ``limits``/``max_queue``/``config`` replace the servicer's request limits, queue bound and loop config."""
    clock = RealClock()
    lm = ToyLM(vocab_size=VOCAB, seed=3)
    target = FakeTarget(lm, clock, prefill_s=0.002, verify_s=0.003)
    draft = FakeDraft(ToyDraftLM(lm, agree_prob=0.7, seed=5), clock, speculate_s=0.001, reference=target)
    provider = setup_tracing("scheduler", "memory")
    with LoopThread() as loop:
        stack = FakeStack("", None, target, draft, lm, TandemMetrics(), provider, None, loop)
        loop.run(_serve(stack, codec, redis_url, limits, max_queue, config, spec_policy))
        try:
            yield stack
        finally:
            loop.run(_stop(stack))
