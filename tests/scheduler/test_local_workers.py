"""The scheduler loop over in-process engines: lossless against target-only greedy, nothing leaked."""

from __future__ import annotations

import asyncio

import pytest
import torch

from scheduler.engine_loop import Scheduler
from scheduler.local_workers import LocalDraftWorker, LocalTargetWorker
from scheduler.policies.speculation import FixedChain, NoSpeculation
from scheduler.request import Request
from shared.engine.config import EngineConfig
from shared.engine.errors import UnknownSequenceError
from shared.engine.factory import build_draft_engine, build_target_engine
from shared.engine.loading import load_causal_lm
from shared.engine.types import VerifyItem

PROMPTS = [[3, 14, 15, 92], [65, 35], [89, 79, 32, 38, 46, 26, 43]]


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    from shared.models.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("models") / "tiny-draft", "llama", num_layers=1, seed=1)


def greedy(model_dir, prompt: list[int], num_tokens: int) -> list[int]:
    """Target-only greedy with transformers' own attention and no KV cache: the ground truth."""
    model = load_causal_lm(model_dir, device="cpu", with_tokenizer=False).model
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def serve_prompts(sched, engines) -> tuple[list[Request], list[list[int]]]:
    """PROMPTS through ``sched`` until idle (12, 15, 18 new tokens); every engine's KV accounted and freed."""
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=12 + 3 * i) for i, p in enumerate(PROMPTS)]

    async def main():
        streams = [sched.submit(r) for r in reqs]
        _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
        return outs

    outs = asyncio.run(main())
    for engine in engines:
        engine.runner.check_accounting()
        assert engine.runner.cache.num_free_blocks == engine.runner.cache.num_blocks
    return reqs, outs


@pytest.mark.parametrize("policy", [NoSpeculation(), FixedChain(3)], ids=["none", "chain3"])
@pytest.mark.parametrize("same_weights", [True, False], ids=["agreeing-draft", "random-draft"])
def test_scheduler_over_local_engines_is_lossless(tiny_model_dir, draft_dir, policy, same_weights):
    config = EngineConfig(num_blocks=64, block_size=4)
    target, _ = build_target_engine(tiny_model_dir, device="cpu", engine_config=config)
    draft, _ = build_draft_engine(tiny_model_dir if same_weights else draft_dir, device="cpu", engine_config=config)
    sched = Scheduler(LocalTargetWorker(target), LocalDraftWorker(draft), spec_policy=policy)
    reqs = [Request(id=f"r{i}", prompt_ids=p, max_new_tokens=9 + i) for i, p in enumerate(PROMPTS)]

    async def main():
        streams = [sched.submit(r) for r in reqs]
        _, *outs = await asyncio.gather(sched.run_until_idle(), *(s.collect() for s in streams))
        return outs

    outs = asyncio.run(main())
    for req, out in zip(reqs, outs):
        assert out == greedy(tiny_model_dir, req.prompt_ids, req.max_new_tokens)
    if isinstance(policy, FixedChain) and same_weights:
        assert all(sum(r.accepted_lens) > 0 for r in reqs)
    for engine in (target, draft):
        engine.runner.check_accounting()
        assert engine.runner.seqs == {} and engine.runner.cache.num_free_blocks == 64


def test_release_is_idempotent_and_errors_pass_through(tiny_model_dir):
    target, _ = build_target_engine(tiny_model_dir, device="cpu", engine_config=EngineConfig(num_blocks=16))
    worker = LocalTargetWorker(target)

    async def main():
        await worker.release(["never-seen", "never-seen"])
        with pytest.raises(UnknownSequenceError):
            await worker.verify([VerifyItem("never-seen")])

    asyncio.run(main())
