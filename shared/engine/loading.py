"""Load a causal LM from local files, ready for inference.

Two sources, both local (``local_files_only=True``; nothing is ever fetched)::

    <dir>/config.json + *.safetensors [+ tokenizer files]   Hugging Face format (fast; the normal case)
    <dir>/<name>.gguf                                       GGUF file, dequantized to dense weights

A GGUF is always dequantized: the engine drives the plain ``nn.Linear``
layers itself (paged KV, tree attention), which packed GGUF kernels would
bypass. Loading one is slow (tens of seconds for 135M parameters), which is
why ``tandem models prepare`` converts GGUF downloads into HF directories once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shared.engine import vocab_subset
from shared.engine.errors import ModelLoadError
from shared.engine.tokenizer_dir import has_tokenizer

# The decoder families the engine drives (runner.py: embed_tokens, rotary_emb, layers whose attention calls the
# "tandem" function); each is tested on a tiny model (tests/conftest.py FAMILIES, shared/models/tiny.py).
SUPPORTED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


@dataclass
class LoadedModel:
    """A model in eval mode without grads, plus what callers need to know about it."""

    model: Any  # transformers PreTrainedModel (a *ForCausalLM)
    tokenizer: Any | None  # None when the source has no tokenizer
    name: str
    dtype: torch.dtype
    device: torch.device
    vocab_size: int  # rows of the logits
    max_context: int  # max_position_embeddings
    source: Path


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; an explicit CUDA device must exist."""
    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        resolved = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except RuntimeError as e:
            raise ModelLoadError(f"unknown device {device!r}: {e}") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {str(resolved)!r} requested but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype = "auto", device: str | torch.device = "auto") -> torch.dtype:
    """``"auto"`` is float32 on CPU (bf16 matmuls are slow there) and bfloat16 on CUDA."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if resolve_device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[dtype.lower()]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto or one of {sorted(DTYPES)}") from None


def load_causal_lm(
    source: str | Path,
    *,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    with_tokenizer: bool = True,
) -> LoadedModel:
    """Load a local HF directory or ``.gguf`` file; raise ModelLoadError when it is not a loadable model."""
    path = Path(source).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)

    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{str(path)!r} is a file but not a .gguf; pass a model directory or a .gguf file")
        model_dir, load_kwargs, name = path.parent, _gguf_kwargs(path), path.stem
        tokenizer_here = True  # a GGUF carries its tokenizer (and chat template) in its metadata
    else:
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"{str(path)!r} is not a Hugging Face model directory (no config.json); "
                "pass a directory with config.json + safetensors, or a .gguf file"
            )
        model_dir, load_kwargs, name = path, {}, path.name
        tokenizer_here = has_tokenizer(path)

    # Imported here, not at module top: transformers costs seconds to import, and
    # modules that only need resolve_dtype / LoadedModel should not pay for it.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch_dtype, local_files_only=True, **load_kwargs
        )
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load a causal LM from {str(path)!r}: {e}") from e
    family = getattr(model.config, "model_type", None)
    if family not in SUPPORTED_FAMILIES:
        raise ModelLoadError(f"{str(path)!r} is a {family!r} model; the engine runs the {', '.join(SUPPORTED_FAMILIES)} "
                             "families (docs/models.md#your-own-pair)")  # fmt: skip
    subset = vocab_subset.read(model_dir)
    if subset is not None:  # a draft that only ever proposes its target's frequent tokens
        try:
            vocab_subset.install(model, subset)
        except ValueError as e:
            raise ModelLoadError(f"{str(path)!r}: bad {vocab_subset.FILE_NAME}: {e}") from e
    model.to(torch_device)
    model.eval()
    model.requires_grad_(False)

    tokenizer = None
    if with_tokenizer and tokenizer_here:
        tok_kwargs = {"gguf_file": load_kwargs["gguf_file"]} if "gguf_file" in load_kwargs else {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True, **tok_kwargs)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelLoadError(f"cannot load the tokenizer of {str(path)!r}: {e}") from e

    config = model.config.get_text_config()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        dtype=torch_dtype,
        device=torch_device,
        vocab_size=config.vocab_size,
        max_context=config.max_position_embeddings,
        source=path,
    )


def _gguf_kwargs(path: Path) -> dict[str, Any]:
    from transformers import GgufConfig

    # dequantize=True also drops the quantizer from the loaded model, so it can be
    # save_pretrained()-ed as a plain HF checkpoint afterwards.
    return {"gguf_file": path.name, "quantization_config": GgufConfig(dequantize=True)}
