"""Run a command's stages against one deadline: each a subprocess with its own time budget (stdlib only).

    records = run_stages(stages, deadline=time.monotonic() + 560, out_dir=Path("/tmp/run"), env=env)

A device call is killed at 600 s with everything it started, so every stage gets
``min(stage.budget_s, time left - reserve)`` seconds; one with less than ``min_s``
left is recorded as skipped, not started. A stage that outlives its budget is
interrupted (SIGINT first, so `finally` blocks stop the services it launched),
then killed, and recorded as ``timeout``; the next stage still runs. Whatever a
stage wrote before that (its result file, its log) stays and is packed.

Every process a stage starts inherits TANDEM_GPU_STAGE_ID; after the stage, any
still alive (services started in sessions of their own) are ended by that mark,
so a stage never leaves the GPU busy for the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

STAGE_ID_ENV = "TANDEM_GPU_STAGE_ID"
INTERRUPT_GRACE_S = 15.0


@dataclass
class Stage:
    name: str
    cmd: list[str]  # run in the repository root; gets --budget-s appended when budget_arg
    budget_s: float  # the most it may take
    min_s: float = 10.0  # skipped when less than this is left
    result: str | None = None  # the JSON file it writes, relative to the output directory
    budget_arg: bool = True
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class StageRecord:
    name: str
    status: str  # ok | failed | timeout | skipped
    budget_s: float
    elapsed_s: float = 0.0
    returncode: int | None = None
    reason: str = ""
    result: str | None = None
    log: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def run_stages(stages: list[Stage], *, deadline: float, out_dir: Path, env: dict[str, str], cwd: Path,
               reserve_s: float = 20.0, log=print, on_record=None) -> list[StageRecord]:  # fmt: skip
    """Run ``stages`` in order within ``deadline`` (time.monotonic()); ``reserve_s`` is kept for packing."""
    records = []
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    for stage in stages:
        left = deadline - time.monotonic() - reserve_s
        if left < stage.min_s:
            rec = StageRecord(stage.name, "skipped", 0.0, reason=f"{max(left, 0):.0f} s left, needs {stage.min_s:.0f} s")
        else:
            rec = run_stage(stage, min(stage.budget_s, left), out_dir=out_dir, env=env, cwd=cwd, log=log)
        records.append(rec)
        log(f"[stage] {rec.name}: {rec.status} in {rec.elapsed_s:.0f} s (budget {rec.budget_s:.0f} s)"
            + (f" - {rec.reason}" if rec.reason else ""))  # fmt: skip
        if on_record is not None:
            on_record(records)
    return records


def run_stage(stage: Stage, budget_s: float, *, out_dir: Path, env: dict[str, str], cwd: Path,
              log=print) -> StageRecord:  # fmt: skip
    log_path = out_dir / "logs" / f"{stage.name}.log"
    mark = uuid.uuid4().hex
    cmd = list(stage.cmd) + (["--budget-s", f"{budget_s:.0f}"] if stage.budget_arg else [])
    full_env = {**env, **stage.env, STAGE_ID_ENV: mark}
    rec = StageRecord(stage.name, "failed", round(budget_s, 1), result=stage.result,
                      log=str(log_path.relative_to(out_dir)))  # fmt: skip
    t0 = time.monotonic()
    with open(log_path, "ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        except OSError as exc:
            rec.reason = f"could not start: {exc}"
            return rec
        try:
            rec.returncode = proc.wait(timeout=budget_s)
            rec.status = "ok" if rec.returncode == 0 else "failed"
            if rec.returncode != 0:
                rec.reason = f"exit {rec.returncode}: {tail(log_path, 3)}"
        except subprocess.TimeoutExpired:
            rec.status = "timeout"
            rec.reason = f"stopped after its {budget_s:.0f} s budget"
            _interrupt(proc)
        finally:
            ended = end_marked(mark)
            if ended:
                log(f"[stage] {stage.name}: ended {ended} leftover processes")
    rec.elapsed_s = round(time.monotonic() - t0, 1)
    if stage.result and rec.status == "ok" and not (out_dir / stage.result).is_file():
        rec.status, rec.reason = "failed", f"exit 0 but no {stage.result}"
    return rec


def _interrupt(proc: subprocess.Popen) -> None:
    """SIGINT to the stage's process group (KeyboardInterrupt runs its cleanup), then SIGKILL."""
    for sig, wait in ((signal.SIGINT, INTERRUPT_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def marked_pids(mark: str, proc_root: Path = Path("/proc")) -> list[int]:
    """Processes whose environment carries TANDEM_GPU_STAGE_ID=mark (this stage's, at any depth)."""
    needle = f"{STAGE_ID_ENV}={mark}".encode()
    pids = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def end_marked(mark: str) -> int:
    """SIGTERM, then SIGKILL, every process of this stage still alive; returns how many there were."""
    pids = marked_pids(mark)
    found = len(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            break
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; it only waits to be reaped
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


class RunLog:
    """Prints with the seconds since the start, and keeps the same lines in a file (packed into $OUT)."""

    def __init__(self, path: Path):
        self.t0 = time.monotonic()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)

    def __call__(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {msg}"
        print(line, flush=True)
        self._file.write(line + "\n")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0
