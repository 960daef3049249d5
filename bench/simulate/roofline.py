"""Step costs of a GPU this project has no machine of: the roofline of a named GPU and a model shape.

One forward of N batched tokens over b sequences that attend to C cached tokens::

    bytes = W * bytes_per_weight  +  (C + N) * kv_bytes_per_token          (weights once, KV read + written)
    flops = 2 * W_layers * N  +  2 * W_head * N  +  4 * L * q_dim * N * C / b   (matmuls, LM head, attention)
    T     = max(bytes / (BW * bw_eff), flops / (F * flop_eff)) / tp
            + 2 * L * allreduce(N)  (tensor parallel)  +  launch_s          one forward
    call  = host_s + the call's forwards    (a verify: one forward; a draft chain of k: k forwards)

The ridge N = F / BW (FLOPs per byte) is AdaServe's budget B (§3, Table 1: A100 156,
H100 582 with the sparse 1979 TFLOPS; 291 with the dense 989 used here).

Efficiencies and host times are not fitted per case. bw_eff = 0.8 is what decode kernels
reach of peak HBM bandwidth; the host's 4 ms per decode step, split as host_s = 2.5 ms per
worker call (scheduling, sampling, the RPC) and launch_s = 1.5 ms per forward (kernel
launches), is set so that Llama-2-7B on one A100 at batch 8 (input 32) costs AdaServe's
measured baseline latency of 12.5 ms (§6.1); ``checks()`` compares with that and with the
other step times the papers publish (docs/simulate.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_bytes_s: float  # peak memory bandwidth
    flops: float  # dense 16-bit tensor FLOP/s
    memory_bytes: float
    link_bytes_s: float = 450e9  # NVLink per direction (tensor parallel all-reduce)
    host_link_bytes_s: float = 25e9  # PCIe to host memory (draft offload/reload)


GPUS = {
    "a100": GPU("A100-80GB-SXM", 2.0e12, 312e12, 80e9, 300e9, 25e9),
    "h100": GPU("H100-80GB-SXM", 3.35e12, 989e12, 80e9, 450e9, 50e9),
    "h200": GPU("H200-141GB-SXM", 4.8e12, 989e12, 141e9, 450e9, 50e9),
    "rtx4090": GPU("RTX-4090-24GB", 1.0e12, 165e12, 24e9, 32e9, 25e9),
    "l20": GPU("L20-48GB", 0.864e12, 119.5e12, 48e9, 32e9, 25e9),
}


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int = 0  # 0: hidden / heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        q, kv = self.heads * self.dim_head, self.kv_heads * self.dim_head
        return self.layers * (self.hidden * q + 2 * self.hidden * kv + q * self.hidden + 3 * self.hidden * self.intermediate)

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab  # the LM head (the embedding is a lookup: rows, not the matrix)

    @property
    def params(self) -> int:
        return self.layer_params + 2 * self.head_params

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.dim_head * bytes_per_value


# Shapes from the models' configs (config.json).
MODELS = {
    "llama-2-7b": ModelShape("Llama-2-7B", 32, 4096, 32, 32, 11008, 32000),
    "llama-2-70b": ModelShape("Llama-2-70B", 80, 8192, 64, 8, 28672, 32000),
    "llama-3.2-1b": ModelShape("Llama-3.2-1B", 16, 2048, 32, 8, 8192, 128256, 64),
    "llama-3-8b": ModelShape("Llama-3-8B", 32, 4096, 32, 8, 14336, 128256),
    "llama-3-70b": ModelShape("Llama-3-70B", 80, 8192, 64, 8, 28672, 128256),
    "qwen2-7b": ModelShape("Qwen2-7B", 28, 3584, 28, 4, 18944, 152064),
    "smollm2-135m": ModelShape("SmolLM2-135M", 30, 576, 9, 3, 1536, 49152),
}

BW_EFFICIENCY = 0.8
FLOP_EFFICIENCY = 0.6
HOST_S = 0.0025  # per worker call
LAUNCH_S = 0.0015  # per forward
ALLREDUCE_LATENCY_S = 8e-6


@dataclass(frozen=True)
class RooflineCosts:
    """StepCosts (step_costs.py) of ``model`` on ``tp`` x ``gpu`` (tensor parallel), 16-bit weights and KV."""

    gpu: GPU
    model: ModelShape
    tp: int = 1
    bw_eff: float = BW_EFFICIENCY
    flop_eff: float = FLOP_EFFICIENCY
    host_s: float = HOST_S
    launch_s: float = LAUNCH_S
    bytes_per_weight: int = 2

    @property
    def name(self) -> str:
        return f"{self.model.name} on {self.tp}x{self.gpu.name} (roofline)"

    def forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        m, n = self.model, max(1, num_batched)
        per_seq_ctx = num_context / max(1, num_seqs)
        weights = (m.layer_params + m.head_params) * self.bytes_per_weight
        kv = (num_context + n) * m.kv_bytes_per_token()
        flops = 2 * (m.layer_params + m.head_params) * n + 4 * m.layers * m.heads * m.dim_head * n * per_seq_ctx
        memory_s = (weights + kv) / (self.gpu.hbm_bytes_s * self.bw_eff)
        compute_s = flops / (self.gpu.flops * self.flop_eff)
        t = max(memory_s, compute_s) / self.tp
        if self.tp > 1:  # two all-reduces of the activations per layer (ring: 2 (tp-1)/tp of the bytes)
            ring = 2 * (self.tp - 1) / self.tp * n * m.hidden * 2
            t += 2 * m.layers * (ALLREDUCE_LATENCY_S + ring / self.gpu.link_bytes_s)
        return t + self.launch_s

    @property
    def call_s(self) -> float:
        return self.host_s

    def weight_bytes(self) -> float:
        return self.model.params * self.bytes_per_weight

    def kv_capacity_tokens(self, memory_fraction: float = 0.9, other_weights: float = 0.0) -> int:
        """KV tokens that fit once the weights (these and ``other_weights`` bytes) are loaded, over ``tp`` GPUs."""
        free = self.gpu.memory_bytes * self.tp * memory_fraction - self.weight_bytes() - other_weights
        return max(0, int(free // self.model.kv_bytes_per_token()))


def roofline(gpu: str, model: str, tp: int = 1) -> RooflineCosts:
    """The costs of ``model`` (a key of MODELS) on ``tp`` x ``gpu`` (a key of GPUS); ValueError names the keys."""
    if gpu.lower() not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    if model.lower() not in MODELS:
        raise ValueError(f"unknown model shape {model!r}; known: {', '.join(MODELS)}")
    if tp < 1:
        raise ValueError("tensor parallelism must be >= 1")
    return RooflineCosts(GPUS[gpu.lower()], MODELS[model.lower()], tp)


@dataclass(frozen=True)
class Check:
    what: str
    source: str
    published_s: float
    roofline_s: float

    @property
    def ratio(self) -> float:
        return self.roofline_s / self.published_s


def checks() -> list[Check]:
    """The roofline against the step times the seed papers publish."""
    a100_7b = roofline("a100", "llama-2-7b")
    out = [
        Check("Llama-2-7B decode, 1xA100, batch 8, input 32 (+64 decoded)", "AdaServe §6.1 baseline latency "
              "(the host time is set from it)", 0.0125, a100_7b.call_s + a100_7b.forward_s(8, 8, 8 * 96)),  # fmt: skip
        # Nightjar §4: c_prefill of DeepSeek-R1-Distill-Qwen-7B ranges from 17.87 ms (short prompts) on one RTX 4090
        Check("Qwen2-7B prefill of 128 tokens, 1xRTX 4090", "Nightjar §4 (c_prefill, low end)", 0.01787,
              _call(roofline("rtx4090", "qwen2-7b"), 1, 128, 0)),
    ]
    return out


def _call(costs: RooflineCosts, num_seqs: int, num_batched: int, num_context: int) -> float:
    return costs.call_s + costs.forward_s(num_seqs, num_batched, num_context)


def ridge_tokens(gpu: str) -> float:
    """FLOPs per byte at the ridge: with 16-bit weights, the tokens per forward where compute meets memory."""
    g = GPUS[gpu]
    return g.flops / g.hbm_bytes_s
