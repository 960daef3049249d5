"""One mixed attention batch on a paged KV pool, run through the SDPA and flashinfer backends alike.

    case = build_case(head_dim=64, num_heads=9, num_kv_heads=3, tree=True, device="cuda")
    outs = run_backends(case, ["sdpa", "flashinfer"])        # {name: [T, H, D] float32}, plus "sdpa32"

The batch mirrors what ``ModelRunner.forward`` builds (docstring of attention/base.py), over blocks
handed out in a shuffled order so that no sequence's pages are contiguous::

    prefill   37 new tokens, causal
    decode    52 cached + 1 new
    tree      40 committed (39 cached) + the root re-fed + 7 nodes, parents [-1, 0, 0, 1, 2, 2, 5]
              (only with tree=True: then the batch needs a custom mask; without, it is all causal)

The pool's old entries and the new q/k/v are random bf16 values. Each backend writes the new k/v
into the same pages and attends; "sdpa32" is SDPA over a float32 copy of the same values (the
reference, METHOD.md: compare against higher precision). Used by the GPU attention test, by the
flashinfer JIT warm-up and by nothing on CPU (flashinfer needs CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.engine.attention.layout import BatchLayout, SeqLayout
from shared.engine.kv_cache import PagedKVCache

TREE_PARENTS = [-1, 0, 0, 1, 2, 2, 5]


@dataclass
class Case:
    cache: PagedKVCache  # bf16 pool shared by the bf16 backends
    layout: BatchLayout
    query: torch.Tensor  # [1, H, T, D]
    key: torch.Tensor  # [1, Hkv, T, D]
    value: torch.Tensor  # [1, Hkv, T, D]
    scaling: float
    tree: bool


def _ancestors(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def build_case(*, head_dim: int, num_heads: int, num_kv_heads: int, tree: bool, device: str | torch.device = "cuda",
               dtype: torch.dtype = torch.bfloat16, block_size: int = 16, seed: int = 0) -> Case:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    device = torch.device(device)
    num_blocks = 64
    cache = PagedKVCache(num_layers=1, num_blocks=num_blocks, block_size=block_size, num_kv_heads=num_kv_heads,
                         head_dim=head_dim, dtype=dtype, device=device)  # fmt: skip
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen).to(dtype))
    order = torch.randperm(num_blocks, generator=gen).tolist()  # blocks handed out shuffled

    def slots_for(kv_len: int) -> torch.Tensor:
        blocks = [order.pop() for _ in range(-(-kv_len // block_size))]
        logical = torch.arange(kv_len)
        return torch.tensor(blocks)[logical // block_size] * block_size + logical % block_size  # [kv_len]

    seqs: list[SeqLayout] = []
    new_slots: list[torch.Tensor] = []
    q_start = 0

    def add(kv_len: int, q_len: int, mask: torch.Tensor, causal: bool) -> None:
        nonlocal q_start
        kv_slots = slots_for(kv_len)
        seqs.append(SeqLayout(q_start, q_len, kv_slots, mask, causal))
        new_slots.append(kv_slots[kv_len - q_len:])
        q_start += q_len

    def causal_mask(q_len: int, kv_len: int) -> torch.Tensor:
        rows = torch.arange(kv_len - q_len, kv_len)
        return torch.arange(kv_len)[None, :] <= rows[:, None]  # [q_len, kv_len]

    add(37, 37, causal_mask(37, 37), True)  # prefill
    add(53, 1, causal_mask(1, 53), True)  # decode
    if tree:
        n, nodes = 40, len(TREE_PARENTS)
        kv_len, q_len = n + nodes, 1 + nodes
        mask = torch.zeros(q_len, kv_len, dtype=torch.bool)
        mask[0, :n] = True  # the root (last committed token, re-fed) sees the committed prefix
        mask[1:, :n] = True
        mask[1:, n:] = _ancestors(TREE_PARENTS)
        add(kv_len, q_len, mask, False)
    num_tokens = q_start
    layout = BatchLayout(seqs=seqs, new_slots=torch.cat(new_slots).to(device), num_tokens=num_tokens, device=device)
    query = torch.randn(1, num_heads, num_tokens, head_dim, generator=gen).to(device=device, dtype=dtype)
    key = torch.randn(1, num_kv_heads, num_tokens, head_dim, generator=gen).to(device=device, dtype=dtype)
    value = torch.randn(1, num_kv_heads, num_tokens, head_dim, generator=gen).to(device=device, dtype=dtype)
    return Case(cache, layout, query, key, value, head_dim**-0.5, tree)


def _backend(name: str, cache: PagedKVCache, device: torch.device):
    if name == "sdpa":
        from shared.engine.attention.sdpa import SdpaBackend

        return SdpaBackend(cache)
    if name == "flashinfer":
        from shared.engine.attention.flashinfer_backend import FlashinferBackend

        return FlashinferBackend(cache, device)
    raise ValueError(name)


@torch.inference_mode()
def run_backends(case: Case, names: list[str], *, reference: bool = True) -> dict[str, torch.Tensor]:
    """Each backend's output [T, H, D] (float32) on the case; "sdpa32" is the float32 reference."""
    device = case.layout.device
    outs: dict[str, torch.Tensor] = {}
    if reference:
        ref_cache = PagedKVCache(num_layers=1, num_blocks=case.cache.num_blocks, block_size=case.cache.block_size,
                                 num_kv_heads=case.cache.num_kv_heads, head_dim=case.cache.head_dim,
                                 dtype=torch.float32, device=device)  # fmt: skip
        ref_cache.kv.copy_(case.cache.kv.float())
        backend = _backend("sdpa", ref_cache, device)
        backend.plan(case.layout)
        out = backend.attend(0, case.query.float(), case.key.float(), case.value.float(), case.scaling)
        outs["sdpa32"] = out[0].float()
    for name in names:
        backend = _backend(name, case.cache, device)
        backend.plan(case.layout)
        out = backend.attend(0, case.query, case.key, case.value, case.scaling)  # [1, T, H, D]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        outs[name] = out[0].float()
    return outs


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Relative Frobenius error, and the largest elementwise error relative to max |ref|."""
    diff = (out - ref).float()
    return {
        "rel_fro": float(diff.norm() / ref.norm()),
        "max_abs_rel": float(diff.abs().max() / ref.abs().max()),
        "finite": bool(torch.isfinite(out).all()),
    }
