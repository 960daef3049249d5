"""What a results.json records about its run besides the measurements: the machine it ran on and
the token budget B the launched scheduler finds."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
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


def ensure_profiles(models: Models, log=print, threads: tuple[int | None, ...] = (None,)) -> list[str]:
    """``tandem profile --if-missing`` for the target and the draft, as `make bench-slo` and friends run it
    first: without a profile the scheduler has no budget B and the cost-model policies (SmartSpec, FASER,
    Nightjar, AdaServe, LAPS-SD's eq. 6) start from a weak generic prior (step_cost.py), which runs launched
    straight through `python -m bench.harness` on a fresh machine did for weeks unnoticed. Returns notes
    for results.json (a failed profile is noted, not raised: the run goes on as the services would).
    ``threads``: CPU thread counts to profile at besides torch's default (None), for stacks whose services
    run on a share of the cores (FASER's split: the scheduler prefers a profile at the service's count)."""
    notes = []
    base = [sys.executable, "-c", "from sdk.cli import app; app()", "profile", "--device", models.device,
            "--dtype", models.dtype, "--if-missing"]  # fmt: skip
    base += ["--model", str(models.target)] if models.target is not None else ["--pair", models.pair]
    if models.home is not None:
        base += ["--home", str(models.home)]
    runs = [(what, extra + ([] if n is None else ["--threads", str(n)]), n)
            for n in threads for what, extra in (("target", []), ("draft", ["--draft"]))]  # fmt: skip
    for what, extra, n in runs:
        if what == "draft" and models.target is not None:
            continue  # an explicit target path: its draft is not a pair's to profile
        what = what if n is None else f"{what} at {n} threads"
        out = subprocess.run([*base, *extra], capture_output=True, text=True,
                             env={**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")})  # fmt: skip
        text = " ".join(out.stdout.split())  # rich wraps its lines at the terminal's width
        if out.returncode != 0:
            notes.append(f"profile of the {what} failed (exit {out.returncode}): {(out.stderr or text)[-300:]}")
            log(f"[yellow]{notes[-1]}")
        elif "already profiled" not in text and "not profiled alone" not in text:  # a feature draft fits online
            budget = text[text.find("B = "):][:80] if "B = " in text else ""
            notes.append(f"profiled the {what} first (none on this machine){': ' + budget if budget else ''}")
            log(notes[-1])
    return notes


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
