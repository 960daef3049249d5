"""Several prompts prefilled in one forward: each computes what it computes alone.

sdpa.py runs a forward with several sequences and a prefill among them as one SDPA call per sequence over
its own rows and slots (no padding to the longest): padded, a 4-prompt prefill cost nearly twice per token
what one prompt alone did (bench/results/diag-prefill). Compared here: the last-token logits of prompts of
different lengths, prefilled together and one at a time; and a prompt continued after a decoded token
beside a fresh prompt (a masked, non-fresh sequence next to a causal one).
"""

import random

import pytest
import torch

from shared.engine.attention.sdpa import SdpaBackend
from shared.engine.runner import Work
from shared.models.tiny import build_tiny

from conftest import make_runner

LENGTHS = [37, 120, 64, 201]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_prompts_prefilled_together_equal_each_alone(dtype, tol):
    model = build_tiny("llama", vocab_size=128, hidden_size=128, num_heads=4, num_kv_heads=2, num_layers=2,
                       seed=3).to(dtype)  # fmt: skip
    rng = random.Random(0)
    prompts = [[rng.randrange(128) for _ in range(n)] for n in LENGTHS]
    together = make_runner(model, block_size=16)
    seqs = [together.add(f"p{i}", p) for i, p in enumerate(prompts)]
    out = together.forward([Work(s, want_root=True) for s in seqs])
    assert isinstance(together.backend, SdpaBackend) and together.backend.per_seq is not None  # one call each
    for i, prompt in enumerate(prompts):
        alone = make_runner(model, block_size=16)
        want = alone.forward([Work(alone.add("a", prompt), want_root=True)]).root(0)
        assert torch.allclose(out.root(i).float(), want.float(), atol=tol, rtol=tol)
        assert int(out.root(i).argmax()) == int(want.argmax())


def test_a_continued_sequence_beside_a_fresh_prompt():
    """A sequence with past KV (masked, not fresh) and a new prompt in one forward, against each alone."""
    model = build_tiny("llama", vocab_size=128, hidden_size=128, num_heads=4, num_kv_heads=2, num_layers=2, seed=4)
    rng = random.Random(2)
    first, second = [rng.randrange(128) for _ in range(50)], [rng.randrange(128) for _ in range(90)]
    extra = [rng.randrange(128) for _ in range(30)]  # fed to the first after its prefill: 30 rows over 80 slots

    def continued(runner, also: list[int] | None):
        seq = runner.add("c", first)
        runner.forward([Work(seq)])
        seq.token_ids.extend(extra)  # committed, not yet cached: the next forward feeds them
        works = [Work(seq, want_root=True)]
        if also is not None:
            works.append(Work(runner.add("f", also), want_root=True))
        return runner.forward(works)

    both = continued(make_runner(model, block_size=16), second)
    alone = continued(make_runner(model, block_size=16), None)
    assert torch.allclose(both.root(0), alone.root(0), atol=1e-5, rtol=1e-5)
    fresh = make_runner(model, block_size=16)
    want = fresh.forward([Work(fresh.add("f", second), want_root=True)]).root(0)
    assert torch.allclose(both.root(1), want, atol=1e-5, rtol=1e-5)
