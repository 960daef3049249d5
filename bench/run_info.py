"""What a results.json records about its run besides the measurements: the machine it ran on and
the token budget B the launched scheduler finds."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from bench.stack import Models


async def token_budget(models: Models, target_dir: Path) -> dict:
    """B as the launched scheduler will find it (TANDEM_TOKEN_BUDGET, else the target's profile on disk)."""
    from types import SimpleNamespace

    from services.scheduler.budget import load_budget
    from services.settings import ServiceSettings

    name = target_dir.stem if target_dir.suffix == ".gguf" else target_dir.name  # what the target reports
    info = SimpleNamespace(model_name=name, device=models.device, dtype=models.dtype)
    budget = await load_budget(ServiceSettings.from_env(home=models.home), info)
    return {"value": budget.token_budget, "source": budget.source}


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo): absolute figures move between machines of the same kind."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine(threads: int) -> dict:
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "hf_peer_threads": threads,
    }


def jsonable(x):
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return str(x) if isinstance(x, Path) else x
