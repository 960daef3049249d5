"""flashinfer paged attention with custom tree masks (GPU only).

The KV pool is already paged the way flashinfer wants it: ``kv[layer]`` is
``[2, num_blocks * block_size, Hkv, D]``, i.e. per layer a key and a value
cache of ``[num_blocks, block_size, Hkv, D]`` ("NHD" layout). A sequence's
pages are its block table, read back from its slot list (``slot = block *
block_size + offset``, see ``ModelRunner._slots``).

One ``plan`` per forward, one ``run`` per layer. Mixed batches (prefill, decode,
tree verification) go through flashinfer's paged prefill kernel: all-causal
batches use ``causal=True``; a batch with any tree passes every sequence's
``[q_len, kv_len]`` mask, flattened, as ``custom_mask``. New k/v are written into
the pages first, so each query sees its own token, as in the SDPA reference.

Two wrappers, one per mask kind, sharing one workspace: a wrapper built with
``backend="auto"`` fixes its kernel family at its *first* ``plan`` and keeps it,
so one wrapper that first planned a causal batch on Hopper (FA3) later ran a
tree's custom mask through FA3, which has no custom-mask kernel ("operation not
supported"; seen on an H100, bench/results/gpu-check-h100). Each wrapper is
therefore built with an explicit family (``kernel_family``): FA3 for causal
batches where the chip and head dim allow it, FA2 for custom masks always.

flashinfer is imported lazily by ``select_backend``; a CPU machine never needs it.
"""

from __future__ import annotations

import inspect

import torch

from shared.engine.attention.layout import BatchLayout
from shared.engine.attention.kv_store import store_kv
from shared.engine.kv_cache import PagedKVCache

WORKSPACE_BYTES = 128 * 1024 * 1024
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (64, 128, 256)  # the head dims flashinfer's prefill kernels are instantiated for


def kernel_family(causal: bool, head_dim: int, compute_capability: tuple[int, int]) -> str:
    """flashinfer's prefill kernel family for a batch: "fa3" (Hopper's warp-specialised kernels) only
    for causal batches on SM 9.x; "fa2" for custom (tree) masks, which FA3 cannot run, and elsewhere."""
    if causal and compute_capability[0] == 9 and head_dim in SUPPORTED_HEAD_DIMS:
        return "fa3"
    return "fa2"


class FlashinferBackend:
    name = "flashinfer"

    def __init__(self, kv_cache: PagedKVCache, device: torch.device):
        import flashinfer

        if device.type != "cuda":
            raise ValueError("the flashinfer backend needs a CUDA device; use attention_backend='sdpa' on CPU")
        if kv_cache.kv.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"flashinfer attention needs fp16 or bf16, not {kv_cache.kv.dtype}; use sdpa for fp32")
        self.cache = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size
        _, _, _, self.num_kv_heads, self.head_dim = kv_cache.kv.shape  # [L, 2, slots, Hkv, D]
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"flashinfer attention needs a head dim in {SUPPORTED_HEAD_DIMS}, not {self.head_dim}; "
                             "use sdpa")  # fmt: skip
        workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # shared: one wrapper runs at a time
        capability = torch.cuda.get_device_capability(device)
        self.families = {causal: kernel_family(causal, self.head_dim, capability) for causal in (True, False)}
        self.wrappers = {
            causal: flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD", backend=family)
            for causal, family in self.families.items()
        }
        self.wrapper = self.wrappers[True]  # the one planned for the current forward
        # flashinfer renamed head_dim -> head_dim_qk (0.2.3); accept both
        params = inspect.signature(self.wrapper.plan).parameters
        self._head_dim_arg = "head_dim_qk" if "head_dim_qk" in params else "head_dim"
        self._planned_heads: int | None = None
        self._layout: BatchLayout | None = None

    def plan(self, layout: BatchLayout) -> None:
        # The number of query heads is only known at the first attend(); plan lazily there.
        self._layout = layout
        self._planned_heads = None
        self.new_slots = layout.new_slots

    def _plan(self, num_qo_heads: int, scaling: float, dtype: torch.dtype) -> None:
        layout = self._layout
        bs = self.block_size
        qo_indptr = [0]
        kv_indptr = [0]
        pages: list[torch.Tensor] = []
        last_page_len: list[int] = []
        masks: list[torch.Tensor] = []
        for s in layout.seqs:
            kv_len = int(s.kv_slots.numel())
            seq_pages = s.kv_slots[::bs] // bs  # [ceil(kv_len / bs)] block table
            pages.append(seq_pages)
            qo_indptr.append(qo_indptr[-1] + s.q_len)
            kv_indptr.append(kv_indptr[-1] + len(seq_pages))
            last_page_len.append(kv_len - (len(seq_pages) - 1) * bs)
            masks.append(s.mask.reshape(-1))
        causal = all(s.causal for s in layout.seqs)
        self.wrapper = self.wrappers[causal]
        dev = self.device
        kwargs = {
            self._head_dim_arg: self.head_dim,
            "causal": causal,
            "custom_mask": None if causal else torch.cat(masks).to(dev),
            "sm_scale": scaling,
            "q_data_type": dtype,
            "kv_data_type": self.cache.kv.dtype,
        }
        self.wrapper.plan(
            torch.tensor(qo_indptr, dtype=torch.int32, device=dev),
            torch.tensor(kv_indptr, dtype=torch.int32, device=dev),
            torch.cat(pages).to(device=dev, dtype=torch.int32),
            torch.tensor(last_page_len, dtype=torch.int32, device=dev),
            num_qo_heads,
            self.num_kv_heads,
            page_size=bs,
            **kwargs,
        )
        self._planned_heads = num_qo_heads

    def attend(self, layer_idx, query, key, value, scaling, new_kv=None):
        kv = self.cache.kv[layer_idx]  # [2, num_slots, Hkv, D]
        store_kv(kv, self.new_slots, key, value, new_kv)
        num_qo_heads = query.shape[1]
        if self._planned_heads != num_qo_heads:
            self._plan(num_qo_heads, scaling, query.dtype)
        shape = (-1, self.block_size, self.num_kv_heads, self.head_dim)
        paged = (kv[0].view(shape), kv[1].view(shape))  # NHD pages: [num_blocks, block_size, Hkv, D] each
        q = query[0].transpose(0, 1).contiguous()  # [T, H, D]
        out = self.wrapper.run(q, paged)  # [T, H, D]
        return out.unsqueeze(0)  # [1, T, H, D]
