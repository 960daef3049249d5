"""The demo draft's shape: a few of the target's own layers, re-trained through low-rank adapters.

::

    target (30 layers)                           draft (len(layer_ids) layers)
    embed_tokens [49152, 576] ── shared, frozen ──▶ embed_tokens   (tied: also the LM head)
    layers[i] for i in layer_ids ── copied ──────▶ layers[j] + LoRA(q, k, v, o, gate, up, down)
    norm ─────────────────────── copied ─────────▶ norm (trained in full: 576 numbers)

The draft sees the same tokens, positions and vocabulary as the target, so it
verifies against it with no mapping. Training touches only the adapters and
the RMSNorm weights; the artefact committed to the repository is exactly
those (a few MB), and ``assemble`` rebuilds the full draft from the target it
was trained against plus that file, with no training on the user's machine.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FORMAT = "tandem-draft-adapter/1"


@dataclass
class DraftSpec:
    layer_ids: list[int] = field(default_factory=lambda: [0, 1, 29])  # target layers the draft starts from
    lora_rank: int = 64
    lora_alpha: float = 64.0

    @property
    def scale(self) -> float:
        return self.lora_alpha / self.lora_rank


class LoRALinear(nn.Module):
    """y = base(x) + scale * x A^T B^T; base frozen. B starts at zero, so training starts at the copied layer."""

    def __init__(self, base: nn.Linear, rank: int, scale: float):
        super().__init__()
        self.base = base
        self.scale = scale
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))  # [rank, in]
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))  # [out, rank]
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.lora_a.T @ self.lora_b.T) * self.scale

    def delta(self) -> torch.Tensor:
        return (self.lora_b @ self.lora_a) * self.scale  # [out, in]


def target_fingerprint(target) -> str:
    """A hash of the target tensors the draft copies: assembling against a different target must fail loudly."""
    digest = hashlib.sha256()
    state = target.state_dict()
    for name in sorted(state):
        if name.startswith("model.embed_tokens") or name == "model.norm.weight":
            digest.update(name.encode())
            digest.update(state[name].float().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def copy_layers(target, layer_ids: list[int]):
    """A Llama with the target's config but only ``layer_ids`` (deep copies), sharing the target's embedding."""
    from transformers import AutoModelForCausalLM

    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(layer_ids)
    config.layer_types = None  # recomputed from num_hidden_layers where the family has it
    with torch.random.fork_rng(devices=[]):  # the random init is overwritten; keep the global RNG untouched
        draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    src = target.state_dict()
    state = {}
    for name in draft.state_dict():
        if name.startswith("model.layers."):
            _, _, j, rest = name.split(".", 3)
            state[name] = src[f"model.layers.{layer_ids[int(j)]}.{rest}"]
        else:
            state[name] = src[name]  # embedding (and the tied head), final norm
    draft.load_state_dict(state)  # copies: training the draft never touches the target
    draft.eval()
    return draft


def add_adapters(draft, spec: DraftSpec) -> list[nn.Parameter]:
    """Freeze everything, wrap the layers' linears in LoRA, unfreeze adapters and norms; return the trained params."""
    draft.requires_grad_(False)
    trained: list[nn.Parameter] = []
    for layer in draft.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name in LORA_TARGETS:
                base = getattr(parent, name, None)
                if isinstance(base, nn.Linear):
                    lora = LoRALinear(base, spec.lora_rank, spec.scale)
                    setattr(parent, name, lora)
                    trained += [lora.lora_a, lora.lora_b]
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.requires_grad_(True)
            trained.append(norm.weight)
    draft.model.norm.weight.requires_grad_(True)
    trained.append(draft.model.norm.weight)
    return trained


def adapter_state(draft) -> dict[str, torch.Tensor]:
    """What training changed: every LoRA factor and every norm weight of the draft."""
    out = {}
    for name, param in draft.named_parameters():
        if "lora_" in name or name.endswith("norm.weight"):
            out[name] = param.detach().clone().contiguous()
    return out


def merge_adapters(draft) -> None:
    """Fold every LoRA back into a plain nn.Linear (what the engine and save_pretrained expect)."""
    with torch.no_grad():
        for layer in draft.model.layers:
            for parent in (layer.self_attn, layer.mlp):
                for name in LORA_TARGETS:
                    lora = getattr(parent, name, None)
                    if isinstance(lora, LoRALinear):
                        lora.base.weight += lora.delta()
                        setattr(parent, name, lora.base)
    draft.requires_grad_(False)


VOCAB_KEY = "vocab_subset"  # int32 [S]: the draft's vocabulary subset (engine/vocab_subset.py), when it has one


def save_adapter(path: Path, draft, spec: DraftSpec, fingerprint: str, info: dict, vocab_ids: list[int] | None = None) -> None:
    """Adapters and norms in fp16 (half the bytes; the merged weights are fp32 again), plus the vocabulary subset."""
    from safetensors.torch import save_file

    tensors = {k: v.half() for k, v in adapter_state(draft).items()}
    if vocab_ids is not None:
        tensors[VOCAB_KEY] = torch.tensor(vocab_ids, dtype=torch.int32)
    metadata = {"format": FORMAT, "spec": json.dumps(asdict(spec)), "target": fingerprint, "info": json.dumps(info)}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)


def load_adapter(path: Path) -> tuple[dict[str, torch.Tensor], DraftSpec, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"{path} is not a {FORMAT} file (format {metadata.get('format')!r})")
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, DraftSpec(**json.loads(metadata["spec"])), metadata


def assemble(target, adapter_path: Path):
    """The trained draft, rebuilt from its target and the adapter file; adapters merged, ready to save."""
    tensors, spec, metadata = load_adapter(adapter_path)
    tensors.pop(VOCAB_KEY, None)  # not a parameter: the caller writes it next to the model (vocab_subset.write)
    fingerprint = target_fingerprint(target)
    if metadata["target"] != fingerprint:
        raise ValueError(
            f"{adapter_path.name} was trained against a target with fingerprint {metadata['target']}, "
            f"this one has {fingerprint}"
        )
    draft = copy_layers(target, spec.layer_ids)
    add_adapters(draft, spec)
    missing = set(adapter_state(draft)) - set(tensors)
    if missing:
        raise ValueError(f"{adapter_path.name} lacks {sorted(missing)[:3]} ...")
    params = dict(draft.named_parameters())
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value.to(params[name].dtype))
    merge_adapters(draft)
    draft.eval()
    return draft


def adapter_vocab(adapter_path: Path) -> list[int] | None:
    """The vocabulary subset stored with the adapter, or None when the draft uses the full vocabulary."""
    tensors, _, _ = load_adapter(adapter_path)
    ids = tensors.get(VOCAB_KEY)
    return None if ids is None else ids.tolist()
