"""Prepare the demo draft, ``smollm2-draft``, from the prepared target plus the committed adapter file.

    models/smollm2-135m-instruct  +  shared/models/weights/smollm2-draft.safetensors (LoRA + norms + vocab subset)
        └── distill.draft.assemble: copy layers [0, 1, 29], merge the adapters ──▶ models/smollm2-draft/
                                                                                      config.json, model.safetensors,
                                                                                      tokenizer files, vocab_subset.json

Seconds, no training: the training ran once (``python -m shared.models.distill``)
and its figures are in ``weights/smollm2-draft.json``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rich.console import Console

from shared.models import smollm2
from shared.models.paths import Paths, is_prepared, mark_prepared

NAME = "smollm2-draft"
ADAPTER = Path(__file__).resolve().parent / "weights" / "smollm2-draft.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def prepare(paths: Paths, console: Console | None = None, *, force: bool = False) -> Path:
    """Make ``models/smollm2-draft`` exist and be complete; return it. Idempotent."""
    console = console or Console()
    out = paths.model_dir(NAME)
    if is_prepared(out) and not force:
        console.print(f"[green]✓[/] {NAME} already prepared at {out}")
        return out
    if not ADAPTER.is_file():
        raise FileNotFoundError(f"{ADAPTER} is missing: run `python -m shared.models.distill` to train the draft")
    start = time.perf_counter()
    target_dir = smollm2.prepare(paths, console)

    import torch
    from transformers import AutoModelForCausalLM

    from shared.engine import vocab_subset
    from shared.models.distill.draft import adapter_vocab, assemble

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, local_files_only=True)
    draft = assemble(target, ADAPTER)
    if out.exists():
        shutil.rmtree(out)
    draft.save_pretrained(out)
    for name in TOKENIZER_FILES:  # same tokenizer as the target: peers that decode text can load it from here
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)
    ids = adapter_vocab(ADAPTER)
    if ids is not None:
        vocab_subset.write(out, ids)
    mark_prepared(out, source=str(ADAPTER.name), target=smollm2.NAME, vocab_subset=len(ids) if ids else None)
    console.print(f"[green]✓[/] {NAME} assembled at {out} in {time.perf_counter() - start:.0f} s")
    return out
