"""A Tandem stack for a benchmark: what `tandem up` starts (services.launcher), plus a span sink.

    with bench_stack(models, StackKey("fixed:4"), log_dir) as stack:
        stack.endpoints.scheduler, stack.endpoints.metrics_url, stack.sink.spans()

The trace exporter and the queue policy reach the children through the launcher's
``extra_env`` (never this process's environment, so several stacks may start at once from
threads), as do the scheduler's frontier pipelining, the target's early exit and the
scheduler's draft offload and its prefill chunk (TANDEM_FRONTIER, TANDEM_EARLY_EXIT, TANDEM_DRAFT_OFFLOAD,
TANDEM_PREFILL_CHUNK);
the draft's share of the machine goes to the launcher (``draft_share``). Stopping the stack (SIGTERM)
makes every service flush its spans into the sink before ``spans()`` is read.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.configs import StackKey
from bench.spans import SpanSink
from services.launcher import LaunchConfig, LaunchedStack, start


@dataclass(frozen=True)
class Models:
    """What the stack serves: a registry pair, or explicit target/draft paths (tests)."""

    pair: str = "demo"
    home: Path | None = None
    target: Path | None = None
    draft: Path | None = None
    device: str = "cpu"
    dtype: str = "float32"

    def target_dir(self) -> Path:
        from services.settings import ServiceSettings

        return ServiceSettings(pair=self.pair, home=self.home, model=str(self.target) if self.target else None).model_path(
            "target"
        )

    def draft_dir(self) -> Path | None:
        """The draft's directory, or None when it is not prepared (the stack then runs without one)."""
        from services.settings import ServiceSettings
        from shared.engine.errors import ModelLoadError

        try:
            return ServiceSettings(
                pair=self.pair, home=self.home, model=str(self.draft) if self.draft else "draft"
            ).model_path("draft")
        except ModelLoadError:
            if self.draft is not None:
                raise
            return None


@dataclass
class BenchStack:
    launched: LaunchedStack
    sink: SpanSink | None

    @property
    def endpoints(self):
        return self.launched.endpoints


@contextmanager
def bench_stack(models: Models, key: StackKey, log_dir: Path, *, traces: bool = True) -> Iterator[BenchStack]:
    sink = SpanSink().start() if traces else None
    env = {"TANDEM_QUEUE_POLICY": key.queue_policy, "TANDEM_LOG_LEVEL": os.environ.get("TANDEM_BENCH_LOG_LEVEL", "warning")}
    for var, value in (("TANDEM_FRONTIER", key.frontier), ("TANDEM_EARLY_EXIT", key.early_exit),
                       ("TANDEM_DRAFT_OFFLOAD", key.draft_offload),
                       ("TANDEM_WORKER_PROTOCOL", key.worker_protocol),
                       ("TANDEM_PREFILL_CHUNK", None if key.prefill_chunk is None else str(key.prefill_chunk))):  # fmt: skip
        if value is not None:
            env[var] = value
    env.update(sink.service_env() if sink else {"TANDEM_TRACE_EXPORTER": "none"})
    config = LaunchConfig(
        pair=models.pair,
        home=models.home,
        target_model=str(models.target) if models.target else None,
        draft_model=key.draft_model or (str(models.draft) if models.draft else None),
        port=0,
        metrics_port=0,
        speculation_policy=key.speculation_policy,
        device=models.device,
        dtype=models.dtype,
        log_dir=log_dir,
        draft_share=key.draft_share,
        extra_env=env,
    )
    try:
        launched = start(config)
        try:
            yield BenchStack(launched, sink)
        finally:
            launched.stop()
    finally:
        if sink is not None:
            sink.stop()
