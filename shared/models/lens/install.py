"""Put the committed tuned lens next to the prepared target, where early exit's ``lens=auto`` finds it."""

from __future__ import annotations

import filecmp
import shutil
from pathlib import Path

from shared.engine.tuned_lens import FILE_NAME

COMMITTED = Path(__file__).resolve().parents[1] / "weights" / "smollm2-lens" / FILE_NAME


def install(target_dir: Path, source: Path = COMMITTED) -> bool:
    """Copy ``source`` into ``target_dir`` unless an identical copy is there; False when there is none to copy."""
    if not source.is_file():
        return False
    dest = Path(target_dir) / FILE_NAME
    if dest.is_file() and filecmp.cmp(source, dest, shallow=False):
        return True
    tmp = dest.with_suffix(".partial")
    shutil.copyfile(source, tmp)
    tmp.replace(dest)
    return True
