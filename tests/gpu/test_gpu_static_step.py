"""CUDA graphs of the static verify step == the eager forward on the same weights (GPU only).

A tiny Llama in float32 on the device: greedy verify steps (chains and trees) through the graph pool
give the same tokens, statuses and committed sequences as the eager forward, the pool replayed graphs
(not only eager fallbacks), and the KV accounting holds with the scratch block reserved.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from shared.engine.config import EngineConfig
from shared.engine.runner import ModelRunner
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, TokenTree, VerifyItem
from shared.models.tiny import build_tiny
from tests.gpu.support import DEVICE, requires_device

pytestmark = [pytest.mark.gpu, requires_device]


def test_graph_replay_equals_eager():
    model = build_tiny("llama", vocab_size=96, seed=0).to(DEVICE)
    fast = TargetEngine(ModelRunner(copy.deepcopy(model), EngineConfig(num_blocks=256, block_size=16)))
    eager = TargetEngine(ModelRunner(copy.deepcopy(model), EngineConfig(num_blocks=256, block_size=16, static_step=False)))
    assert fast.static is not None and fast.static.graphs is not None
    rng = random.Random(0)
    prompts = {f"s{i}": [rng.randrange(96) for _ in range(5 + 9 * i)] for i in range(3)}
    for e in (fast, eager):
        e.prefill([PrefillItem(k, p) for k, p in prompts.items()])
    for step in range(20):
        items = []
        for k in prompts:
            m = rng.randrange(0, 6)
            parents = list(range(-1, m - 1)) if step % 2 else [rng.randrange(-1, j) for j in range(m)]
            items.append(VerifyItem(k, TokenTree([rng.randrange(96) for _ in range(m)], parents)))
        for a, b in zip(fast.verify(items), eager.verify(items)):
            assert (a.tokens, a.accepted_nodes, a.node_status) == (b.tokens, b.accepted_nodes, b.node_status)
        fast.runner.check_accounting()
    for k in prompts:
        assert fast.runner.get(k).token_ids == eager.runner.get(k).token_ids
    assert fast.static.graphs.replays > 0
    torch.cuda.synchronize()
