"""`tandem models ...`: list, prepare and smoke-check the model pairs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from shared.models import registry
from shared.models.paths import Paths

app = typer.Typer(help="List, prepare and check the draft/target model pairs.", no_args_is_help=True)

# A fixed prompt so `check` output is comparable across runs and machines.
CHECK_PROMPT = "The capital of France is"

HomeOption = Annotated[
    Optional[Path],
    typer.Option("--home", help="Artefact directory (default: $TANDEM_HOME, else ~/.cache/tandem)."),
]
PairOption = Annotated[str, typer.Option("--pair", help=f"Model pair: {', '.join(registry.PAIRS)}.")]


def _pair(name: str) -> registry.ModelPair:
    try:
        return registry.get_pair(name)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--pair") from None


@app.command("list")
def list_(home: HomeOption = None) -> None:
    """Show every pair's models, whether they are prepared and their size on disk."""
    paths = Paths.resolve(home)
    table = Table(title=f"model pairs (home: {paths.home})")
    for column in ("pair", "role", "model", "prepared", "size", "path / note"):
        table.add_column(column)
    for pair in registry.PAIRS.values():
        for s in registry.status(pair, paths):
            table.add_row(
                s.pair,
                s.role,
                s.name,
                "[green]yes[/]" if s.prepared else "[yellow]no[/]",
                _size(s.size_bytes),
                str(s.path) if s.prepared else s.note,
            )
    Console().print(table)


@app.command()
def prepare(
    pair: PairOption = "demo",
    home: HomeOption = None,
    force: Annotated[bool, typer.Option("--force", help="Rebuild even when already prepared.")] = False,
) -> None:
    """Download/convert/build the pair's models that Tandem makes itself (idempotent)."""
    console = Console()
    try:
        registry.prepare(_pair(pair), Paths.resolve(home), console, force=force)
    except RuntimeError as e:
        console.print(f"[red]prepare failed:[/] {e}")
        raise typer.Exit(1) from None


@app.command()
def check(pair: PairOption = "demo", home: HomeOption = None) -> None:
    """Load the pair's prepared models and greedily generate one token from a fixed prompt."""
    from shared.engine.errors import ModelLoadError
    from shared.engine.loading import load_causal_lm

    console = Console()
    spec = _pair(pair)
    statuses = registry.status(spec, Paths.resolve(home))
    target = statuses[0]
    if not target.prepared:
        console.print(f"[red]target {target.name} is not prepared:[/] {target.note}")
        raise typer.Exit(1)
    vocab_sizes = {}
    for s in statuses:
        if not s.prepared:
            console.print(f"[yellow]·[/] {s.role} {s.name} skipped: not prepared ({s.note})")
            continue
        t = time.perf_counter()
        try:
            loaded = load_causal_lm(s.path)
        except ModelLoadError as e:
            console.print(f"[red]{s.role} {s.name}: {e}[/]")
            raise typer.Exit(1) from None
        token, text = _next_token(loaded)
        vocab_sizes[s.role] = loaded.vocab_size
        console.print(
            f"[green]ok[/] {s.role} {s.name}: {CHECK_PROMPT!r} -> {token} {text!r} "
            f"({loaded.dtype}, {loaded.device}, {time.perf_counter() - t:.1f} s)"
        )
    if len(set(vocab_sizes.values())) > 1:
        console.print(f"[red]target and draft vocabularies differ: {vocab_sizes}[/]")
        raise typer.Exit(1)


def _size(num_bytes: int) -> str:
    if not num_bytes:
        return "-"
    return f"{num_bytes / 1e6:.0f} MB" if num_bytes >= 1e6 else f"{num_bytes / 1e3:.0f} kB"


def _next_token(loaded) -> tuple[int, str]:
    import torch

    if loaded.tokenizer is not None:
        input_ids = loaded.tokenizer(CHECK_PROMPT, return_tensors="pt").input_ids
    else:
        input_ids = torch.tensor([[0, 1, 2, 3]])  # tokenizer-less test models: any in-vocabulary ids
    input_ids = input_ids.to(loaded.device)
    out = loaded.model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=1, do_sample=False
    )
    token = int(out[0, -1])
    text = loaded.tokenizer.decode([token]) if loaded.tokenizer is not None else ""
    return token, text
