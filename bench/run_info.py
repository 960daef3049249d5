"""What a results.json records about its run besides the measurements: the machine it ran on and
the token budget B the launched scheduler finds."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

from bench.stack import Models


async def token_budget(models: Models, target_dir: Path, cpu_threads: int = 0) -> dict:
    """B as the launched scheduler will find it (TANDEM_TOKEN_BUDGET, else the target's profile on disk).
    ``cpu_threads``: the target service's torch threads on a CPU (0: not a CPU, or unknown), which picks the
    profile measured at that count as the scheduler does (services/scheduler/budget.py)."""
    from types import SimpleNamespace

    from services.scheduler.budget import load_budget
    from services.settings import ServiceSettings

    name = target_dir.stem if target_dir.suffix == ".gguf" else target_dir.name  # what the target reports
    info = SimpleNamespace(model_name=name, device=models.device, dtype=models.dtype, cpu_threads=cpu_threads)
    budget = await load_budget(ServiceSettings.from_env(home=models.home), info)
    return {"value": budget.token_budget, "source": budget.source}


def _on_cpu(models: Models) -> bool:
    device = str(models.device).split(":")[0]
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return device == "cpu"


def faser_split(models: Models, configs: list[str]) -> tuple[int, int] | None:
    """(draft, target) torch threads when this run's FASER stacks split the CPU's cores between the two models
    (bench/configs.py FASER_DRAFT_SHARE), else None (no FASER configuration, or not on a CPU)."""
    if not any(name.startswith("faser:") for name in configs) or not _on_cpu(models):
        return None
    from bench.configs import FASER_DRAFT_SHARE
    from shared.profiling.sm_share import available_cores, split_threads

    return split_threads(FASER_DRAFT_SHARE, available_cores())


def target_threads(models: Models, configs: list[str]) -> int:
    """The target service's torch threads in this run's stacks, as it reports them (0 off the CPU): its share of
    FASER's split, else every core (torch's default in a fresh process)."""
    from shared.profiling.sm_share import available_cores

    if not _on_cpu(models):
        return 0
    split = faser_split(models, configs)
    return available_cores() if split is None else split[1]


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


def git_commit() -> str | None:
    """The checkout's commit (short), "+dirty" when tracked files differ from it; None outside git."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               cwd=root, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


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
