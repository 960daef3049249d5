"""flashinfer backend == SDPA backend on the same mixed batch (GPU only; skipped on CPU).

Same weights, same batch (prefills, decodes and trees of several shapes with
different prefix lengths), two runners that differ only in the attention
backend. bf16 arithmetic differs between kernels, so logits are compared with
a bf16 tolerance and greedy decisions must agree where the margin is clear.
"""

import random

import pytest
import torch

from shared.engine.runner import Work
from shared.models.tiny import build_tiny

from conftest import make_runner

flashinfer = pytest.importorskip("flashinfer", reason="flashinfer is a GPU-only optional dependency")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="flashinfer needs CUDA")

SHAPES = [[-1, 0, 1, 2], [-1, -1, 0, 0, 1, 1], [-1, 0, 0, 1, 2, 2, 5]]


def runner_on_gpu(model, backend):
    return make_runner(model, block_size=16, attention_backend=backend)


def run_batch(runner, rng_seed):
    rng = random.Random(rng_seed)
    works = []
    for i, parents in enumerate(SHAPES):
        seq = runner.add(f"tree{i}", [rng.randrange(256) for _ in range(5 + 19 * i)])
        runner.forward([Work(seq)])  # cached prefix
        works.append(Work(seq, new_nodes=[(rng.randrange(256), p) for p in parents], want_root=True, want_nodes=True))
    decode = runner.add("decode", [rng.randrange(256) for _ in range(40)])
    runner.forward([Work(decode)])
    runner.commit(decode, [rng.randrange(256)])
    works.append(Work(decode, want_root=True))
    works.append(Work(runner.add("prefill", [rng.randrange(256) for _ in range(33)]), want_root=True))
    return runner.forward(works).logits.float()


def test_flashinfer_matches_sdpa_on_mixed_tree_batch():
    # head_dim 64: a size flashinfer compiles kernels for
    model = build_tiny("llama", vocab_size=256, hidden_size=256, num_heads=4, num_kv_heads=2, seed=5)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    sdpa = runner_on_gpu(model, "sdpa")
    fi = runner_on_gpu(model, "flashinfer")
    assert fi.backend.name == "flashinfer"
    ref = run_batch(sdpa, 0)
    got = run_batch(fi, 0)
    assert got.shape == ref.shape
    assert (got - ref).abs().max().item() < 5e-2 * max(1.0, ref.abs().max().item())
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1
    assert torch.equal(got.argmax(-1)[clear], ref.argmax(-1)[clear])


def test_auto_picks_flashinfer_for_half_precision_on_cuda():
    model = build_tiny("llama", vocab_size=256, hidden_size=256, num_heads=4, num_kv_heads=2, seed=5)
    assert runner_on_gpu(model.to("cuda", torch.bfloat16), "auto").backend.name == "flashinfer"
    assert runner_on_gpu(model.to("cuda", torch.float32), "auto").backend.name == "sdpa"
