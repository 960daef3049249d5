"""The tiny *trained* pair: a ~4M-parameter llama target and a ~1M draft distilled from it, on Python code.

    CPython stdlib *.py ──▶ byte-level BPE (4096) ──▶ target: next-token LM          corpus.py
                                                        │ greedy continuations of held-in snippets + top-k
                                                        ▼
                                                      draft: distilled on them            distill/train.py's loss
    ──▶ shared/models/weights/tiny-trained/{target,draft}/   HF directories, fp16, with the tokenizer (committed)
    ──▶ shared/models/weights/tiny-trained/report.json        command, settings, times, held-out agreement

Trained once by ``python -m shared.models.tiny_trained`` (CPU, minutes); ``tandem
models prepare --pair tiny-trained`` only copies the committed directories into
<home>/models. Tests that need realistic acceptance (a draft that mostly agrees
with its target) use it; the random ``tiny`` pair agrees by chance only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from shared.models.paths import Paths, is_prepared, mark_prepared

WEIGHTS = Path(__file__).resolve().parents[1] / "weights" / "tiny-trained"
REPORT = WEIGHTS / "report.json"
TARGET = "tiny-trained-target"
DRAFT = "tiny-trained-draft"
SOURCES = {TARGET: WEIGHTS / "target", DRAFT: WEIGHTS / "draft"}


def prepare(name: str, paths: Paths, console: Console | None = None, *, force: bool = False) -> Path:
    """Copy the committed directory of ``name`` into <home>/models; idempotent."""
    console = console or Console()
    out, source = paths.model_dir(name), SOURCES[name]
    if is_prepared(out) and not force:
        console.print(f"[green]✓[/] {name} already prepared at {out}")
        return out
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} is missing: run `python -m shared.models.tiny_trained` to train the pair")
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    mark_prepared(out, source=str(source.relative_to(WEIGHTS.parents[3])))
    console.print(f"[green]✓[/] {name} copied to {out}")
    return out
