"""Prepare ``smollm2-eagle3``, the demo target's EAGLE-3 head, from the committed head plus the target.

    models/smollm2-135m-instruct  +  shared/models/weights/smollm2-eagle3/head.safetensors (fc, layer, norm, d2t)
        └── embed_tokens + the draft vocabulary's LM-head rows copied from the target ──▶ models/smollm2-eagle3/
                                                                                          config.json, model.safetensors

Seconds, no training: the training ran once (``python -m shared.models.eagle``)
and its figures are in ``weights/smollm2-eagle3/report.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from rich.console import Console

from shared.models import smollm2
from shared.models.paths import PREPARED_MARKER, Paths, is_prepared, mark_prepared

NAME = "smollm2-eagle3"
WEIGHTS = Path(__file__).resolve().parent / "weights" / NAME
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def prepare(paths: Paths, console: Console | None = None, *, force: bool = False) -> Path:
    """Make ``models/smollm2-eagle3`` exist and be complete; return it. Idempotent."""
    console = console or Console()
    out = paths.model_dir(NAME)
    head_file = WEIGHTS / "head.safetensors"
    if not head_file.is_file():
        raise FileNotFoundError(f"{head_file} is missing: run `python -m shared.models.eagle` to train the head")
    digest = head_digest(head_file)
    if is_prepared(out) and not force:
        if prepared_digest(out) == digest:
            console.print(f"[green]✓[/] {NAME} already prepared at {out}")
            return out
        console.print(f"{NAME} at {out} was assembled from another head than the committed one: assembling again")
    start = time.perf_counter()
    target_dir = smollm2.prepare(paths, console)

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from shared.engine.eagle.loading import EMBED_KEYS

    state = {}
    with safe_open(str(head_file), framework="pt") as f:
        for key in f.keys():
            state[key] = f.get_tensor(key)
    embed = None
    for file in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for key in EMBED_KEYS:
                if key in f.keys():
                    embed = f.get_tensor(key).float()
    if embed is None:
        raise FileNotFoundError(f"{target_dir}: no embed_tokens.weight")
    d2t = state["d2t"].long()
    ids = torch.arange(len(d2t)) + d2t
    state = {k: (v if k == "d2t" else v.float()) for k, v in state.items()}
    state["embed_tokens.weight"] = embed.contiguous()
    state["lm_head.weight"] = embed[ids].contiguous()  # SmolLM2 ties its LM head to its embedding
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"))
    shutil.copy2(WEIGHTS / "config.json", out / "config.json")
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)
    report = json.loads((WEIGHTS / "report.json").read_text()) if (WEIGHTS / "report.json").is_file() else {}
    mark_prepared(out, source=head_file.name, head_sha1=digest, target=smollm2.NAME,
                  heldout_k4=report.get("heldout_k4", {}).get("all", {}).get("mean_accepted_length"))  # fmt: skip
    console.print(f"[green]✓[/] {NAME} assembled at {out} in {time.perf_counter() - start:.0f} s")
    return out


def head_digest(head_file: Path) -> str:
    """SHA-1 of the committed head file: what a prepared copy was assembled from."""
    return hashlib.sha1(head_file.read_bytes()).hexdigest()


def prepared_digest(model_dir: Path) -> str | None:
    """The head digest recorded when ``model_dir`` was assembled (None: an older copy that recorded none)."""
    try:
        return json.loads((model_dir / PREPARED_MARKER).read_text()).get("head_sha1")
    except (OSError, ValueError):
        return None
