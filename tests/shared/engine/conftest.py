"""Engine test helpers: tiny models, a plain-HF reference, engines over them."""

from __future__ import annotations

import copy

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.runner import ModelRunner
from shared.engine.target_engine import TargetEngine
from shared.models.tiny import build_tiny


class Reference:
    """The same weights under transformers' own attention: the ground truth."""

    def __init__(self, model):
        config = copy.deepcopy(model.config)
        config._attn_implementation = "sdpa"
        self.model = type(model)(config).eval()
        self.model.load_state_dict(model.state_dict())

    @torch.inference_mode()
    def logits(self, token_ids: list[int]) -> torch.Tensor:
        """[len(token_ids), vocab] logits of running the sequence alone."""
        return self.model(torch.tensor([token_ids])).logits[0].float()

    def greedy(self, prompt: list[int], num_tokens: int) -> list[int]:
        out = list(prompt)
        for _ in range(num_tokens):
            out.append(int(self.logits(out)[-1].argmax()))
        return out[len(prompt) :]


def path_to(parents, node):
    """Root-to-node path of tree node ``node`` (node indices; a parent of -1 is the root)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def make_runner(model, *, num_blocks: int = 512, block_size: int = 4, **kw) -> ModelRunner:
    return ModelRunner(model, EngineConfig(num_blocks=num_blocks, block_size=block_size, **kw))


@pytest.fixture
def target_model():
    return build_tiny("llama", vocab_size=96, seed=0)


@pytest.fixture
def draft_model():
    return build_tiny("llama", vocab_size=96, seed=1, hidden_size=32, num_layers=1)


@pytest.fixture
def reference(target_model):
    return Reference(target_model)


@pytest.fixture
def target(target_model):
    return TargetEngine(make_runner(target_model))


@pytest.fixture
def draft(draft_model):
    return DraftEngine(make_runner(draft_model))
