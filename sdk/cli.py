"""The `tandem` command: the root app that each area mounts its sub-commands on."""

from __future__ import annotations

import typer

from shared.models.cli import app as models_app

app = typer.Typer(help="Tandem: LLM serving with SLO-aware speculative decoding.", no_args_is_help=True)
app.add_typer(models_app, name="models")


if __name__ == "__main__":
    app()
