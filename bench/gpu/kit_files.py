"""Where the GPU kit's files live, here and on the GPU machine, and how they are checked (sha256)."""

from __future__ import annotations

import hashlib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KIT_DIR = REPO_ROOT / ".gpu-kit"
MANIFEST = "manifest.json"
PLAN = "plan.json"
MIB = 1024 * 1024
SITE_ENV = "TANDEM_GPU_SITE"  # where the wheels are installed on the GPU machine (PYTHONPATH); default below
DEFAULT_SITE = Path("/tmp/tandem-site")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(8 * MIB), b""):
            h.update(chunk)
    return h.hexdigest()
