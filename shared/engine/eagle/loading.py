"""Load and save EAGLE-3 heads (directory: config.json + safetensors), never fetching anything.

    head, cfg = load_head("~/.cache/tandem/models/smollm2-eagle3", target_dir=None, dtype=torch.float32)

The token embedding comes from the head directory when it carries
``embed_tokens.weight`` (Tandem's prepared heads do), else from the target's
directory (published heads usually leave it out: they share the target's).
A head whose sizes do not fit its target fails here with ModelLoadError.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from shared.engine.eagle.model import ARCHITECTURE, Eagle3Config, Eagle3Head, head_state_keys
from shared.engine.errors import ModelLoadError

EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight")


def is_eagle_dir(path: Path | str) -> bool:
    """True when ``path`` is a directory whose config.json names an EAGLE-3 head."""
    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        raw = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    archs = raw.get("architectures") or []
    return any("eagle3" in a.lower() for a in archs)


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    if not out:
        raise ModelLoadError(f"{directory}: no *.safetensors weights")
    return out


def _target_embedding(target_dir: Path) -> tuple[torch.Tensor, dict]:
    raw = json.loads((target_dir / "config.json").read_text())
    for file in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in EMBED_KEYS:
                if key in f.keys():
                    return f.get_tensor(key), raw
    raise ModelLoadError(f"{target_dir}: no embed_tokens.weight in its safetensors")


def load_head(
    head_dir: Path | str,
    *,
    target_dir: Path | str | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> Eagle3Head:
    head_dir = Path(head_dir).expanduser()
    if not is_eagle_dir(head_dir):
        raise ModelLoadError(f"{head_dir} is not an EAGLE-3 head (config.json must name {ARCHITECTURE})")
    raw = json.loads((head_dir / "config.json").read_text())
    tensors = head_state_keys(_tensors(head_dir))
    target_raw: dict | None = None
    if "embed_tokens.weight" not in tensors:
        if target_dir is None:
            raise ModelLoadError(
                f"{head_dir}: the head carries no embed_tokens.weight, and no target directory was given to take it from"
            )
        tensors["embed_tokens.weight"], target_raw = _target_embedding(Path(target_dir).expanduser())
    elif target_dir is not None and (Path(target_dir).expanduser() / "config.json").is_file():
        target_raw = json.loads((Path(target_dir).expanduser() / "config.json").read_text())
    try:
        cfg = Eagle3Config.from_json(raw, num_target_layers=(target_raw or {}).get("num_hidden_layers"))
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(f"{head_dir}/config.json: {exc}") from exc
    if target_raw is not None:
        check_fits(cfg, target_raw, head_dir)
    head = Eagle3Head(cfg)
    if "d2t" not in tensors:
        tensors["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    tensors.pop("t2d", None)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("rotary_emb.")}
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not k.startswith("rotary_emb.")]
    if missing or unexpected:
        raise ModelLoadError(f"{head_dir}: weights do not match the EAGLE-3 layout (missing {missing}, unexpected {unexpected})")
    head.d2t.copy_(tensors["d2t"].long())
    head.to(device=device, dtype=dtype)
    head.d2t.data = head.d2t.data.long()
    head.eval().requires_grad_(False)
    return head


def check_fits(cfg: Eagle3Config, target_raw: dict, where: Path | str) -> None:
    """The head must read the target's features and speak its vocabulary."""
    hidden = target_raw.get("hidden_size")
    layers = target_raw.get("num_hidden_layers")
    vocab = target_raw.get("vocab_size")
    if hidden is not None and cfg.target_hidden_size != hidden:
        raise ModelLoadError(
            f"{where}: the head reads target features of width {cfg.target_hidden_size}, the target's hidden size is {hidden}"
        )
    if layers is not None and not all(0 <= i <= layers for i in cfg.aux_layer_ids):
        raise ModelLoadError(f"{where}: aux layers {cfg.aux_layer_ids} outside the target's 0..{layers}")
    if vocab is not None and cfg.vocab_size != vocab:
        raise ModelLoadError(f"{where}: the head's vocabulary is {cfg.vocab_size} tokens, the target's {vocab}")


def save_head(head: Eagle3Head, out_dir: Path | str, *, dtype: torch.dtype = torch.float16, with_embedding: bool = False) -> Path:
    """Write the head in the published layout (config.json + model.safetensors)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, value in head.state_dict().items():
        if key.startswith("rotary_emb.") or (key == "embed_tokens.weight" and not with_embedding):
            continue
        state[key] = value.detach().to("cpu").contiguous() if key == "d2t" else value.detach().to("cpu", dtype).contiguous()
    d2t = head.d2t.cpu()
    t2d = torch.zeros(head.cfg.vocab_size, dtype=torch.bool)
    t2d[torch.arange(head.cfg.draft_vocab_size) + d2t] = True
    state["t2d"] = t2d
    save_file(state, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(head.cfg.to_json(), indent=2) + "\n")
    return out_dir
