"""A real Tandem stack in this process: target, draft and scheduler over gRPC on loopback, real Redis.

    with tiny_stack(target_dir, draft_dir) as stack:     # tiny models: save_tiny_pair(directory)
        Client(stack.address).generate([1, 2, 3], max_new_tokens=8)
    with tiny_stack(target_dir, "ngram:1-4", vocab_size=VOCAB) as stack:   # the model-free draft

All three services run on one event loop in a background thread
(loop_thread.py), each with its own in-memory span exporter, so a test can
follow one trace across the three. ``Reference`` computes the target's
greedy output with plain transformers: what the whole system must reproduce.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.loop_thread import LoopThread

VOCAB = 512
MAX_CONTEXT = 1024
SPEC_K = 3  # the scheduler's policy for AUTO requests: fixed:3


def save_tiny_pair(root: Path) -> tuple[Path, Path]:
    """(target dir, draft dir): tiny random llamas sharing a 512-token vocabulary, no tokenizer."""
    from shared.models.tiny import save_tiny

    target = save_tiny(root / "target", "llama", num_layers=2, seed=0, max_position_embeddings=MAX_CONTEXT)
    draft = save_tiny(root / "draft", "llama", num_layers=1, seed=1, max_position_embeddings=MAX_CONTEXT)
    return target, draft


@dataclass
class Stack:
    loop: LoopThread
    target: Any  # services.runtime.RunningService
    draft: Any
    scheduler: Any  # services.scheduler.main.RunningScheduler
    redis_url: str
    draft_settings: Any

    @property
    def address(self) -> str:
        return self.scheduler.address

    def restart_draft(self) -> None:
        """Start a fresh draft service (empty KV cache) on the port the stopped one had."""
        from services.model_main import start

        self.draft = self.loop.run(start(self.draft_settings.model_copy(update={"port": self.draft.port}), "draft"))


class Reference:
    """Target-only greedy decoding with plain transformers: what the whole system must reproduce."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval()
        self._cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        import torch

        key = (tuple(prompt), num_tokens)
        if key not in self._cache:
            ids = torch.tensor([prompt])
            out, past = [], None
            with torch.inference_mode():
                for _ in range(num_tokens):
                    step = self.model(ids if past is None else ids[:, -1:], past_key_values=past, use_cache=True)
                    past = step.past_key_values
                    out.append(int(step.logits[0, -1].argmax()))
                    ids = torch.cat([ids, torch.tensor([[out[-1]]])], dim=1)
            self._cache[key] = out
        return copy.copy(self._cache[key])


@contextmanager
def tiny_stack(target_dir: Path, draft_dir: Path | str, **draft_overrides: Any) -> Iterator[Stack]:
    """``draft_dir``: a model directory or an ngram spec; ``draft_overrides``: more draft settings."""
    from services.model_main import start as start_model
    from services.scheduler.main import start as start_scheduler
    from services.settings import ServiceSettings
    from shared.state.redis_server import start_redis

    common = {"port": 0, "trace_exporter": "memory", "device": "cpu", "dtype": "float32", "shutdown_grace_s": 0.5}
    redis = start_redis()
    with LoopThread() as loop, ExitStack() as cleanup:
        cleanup.callback(redis.stop)
        target = loop.run(start_model(ServiceSettings(model=str(target_dir), **common), "target"))
        cleanup.callback(lambda: loop.run(target.stop()))
        stack = Stack(loop, target, None, None, redis.url, ServiceSettings(model=str(draft_dir), **common, **draft_overrides))
        stack.draft = loop.run(start_model(stack.draft_settings, "draft"))
        cleanup.callback(lambda: loop.run(stack.draft.stop()))  # the current one: tests may restart it
        stack.scheduler = loop.run(
            start_scheduler(
                ServiceSettings(
                    model=str(target_dir),  # where the scheduler looks for a tokenizer (there is none)
                    target_addr=target.address,
                    draft_addr=stack.draft.address,
                    redis_url=redis.url,
                    metrics_port=0,
                    speculation_policy=f"fixed:{SPEC_K}",
                    **common,
                )
            )
        )
        cleanup.callback(lambda: loop.run(stack.scheduler.stop()))
        yield stack
