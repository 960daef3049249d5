"""Draft and target on one GPU at once (FASER §4.4): SM split by MPS or green contexts vs plain time-slicing.

    python -m bench.gpu.sm_split --out sm_split.json [--window-s 5] [--mps-shares 50,25] [--green-sms 40]

The demo pair in bf16, each model busy with what a pipelined round gives it: the draft drafting a
chain of 4 for 8 sequences (``DraftEngine.speculate``), the target verifying root + 4 for 8
sequences (one forward, then rolled back), in loops. Every mode measures three windows, scheduled
by wall clock once both sides are loaded::

    draft alone | target alone | both at once        (median step time in each)

    time-slicing   two processes, no MPS: the GPU time-slices between their contexts
    mps-R          two processes under an MPS daemon started here (its own pipe directory under /tmp),
                   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE R (draft) and 100 - R (target), as the launcher sets
                   them for draft_share = R / 100; the alone windows are each model at its share
    green-N        one process, two threads, each on a stream of its own green context (N SMs for the
                   draft, the rest for the target; flashinfer.green_ctx, CUDA driver API). In one process
                   the two share the GIL, and the runner's device-wide synchronize is narrowed to the
                   thread's own stream here (it would couple the two)

A pipelined round lasts max(draft, target) of the "both" window; serial speculative decoding pays
draft + target alone (results.sm_split_highlights compares them). Each worker writes its own file;
the orchestrator keeps what finished when a mode fails (MPS may be unavailable in a VM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BATCH = 8
CHAIN = 4
CONTEXT = 64
STARTUP_TIMEOUT_S = 120.0


# ----------------------------------------------------------------------------- the workloads (torch)


def _workload(role: str, device: str):
    """(engine name, step function) for ``role``, its sequences prefilled."""
    from shared.engine.factory import build_draft_engine, build_target_engine
    from shared.engine.runner import Work
    from shared.engine.types import PrefillItem, SpecItem
    from shared.models.paths import Paths
    from shared.models.registry import get_pair

    pair = get_pair("demo")
    paths = Paths.resolve()
    ids = [f"split-{role}-{i}" for i in range(BATCH)]
    if role == "draft":
        engine, loaded = build_draft_engine(paths.model_dir(pair.draft.name), device=device, dtype="bfloat16",
                                            with_tokenizer=False)  # fmt: skip
        vocab = engine.runner.vocab_size
        engine.prefill([PrefillItem(s, [(11 + 7 * i + j) % vocab for j in range(CONTEXT)]) for i, s in enumerate(ids)])

        def step() -> None:  # each call drops the previous chain and drafts again
            engine.speculate([SpecItem(s, chain_len=CHAIN) for s in ids])

        return loaded.name, step
    engine, loaded = build_target_engine(paths.model_dir(pair.target.name), device=device, dtype="bfloat16",
                                         with_tokenizer=False)  # fmt: skip
    runner = engine.runner
    vocab = runner.vocab_size
    seqs = [runner.add(s, [(11 + 7 * i + j) % vocab for j in range(CONTEXT)]) for i, s in enumerate(ids)]
    runner.forward([Work(s) for s in seqs])

    def step() -> None:  # one verify forward of root + CHAIN per sequence, then rolled back
        runner.forward([Work(s, new_nodes=[((7 + j) % vocab, j - 1) for j in range(CHAIN)], want_root=True,
                             want_nodes=True) for s in seqs])  # fmt: skip
        for s in seqs:
            runner.commit(s, [])

    return loaded.name, step


def _run_windows(role: str, step, windows: list[dict], sync) -> dict:
    """Step in a loop inside each window where ``role`` is active; median step time per window."""
    out = {}
    for w in windows:
        while time.time() < w["start"]:
            time.sleep(min(0.01, max(0.0, w["start"] - time.time())))
        if role not in w["active"]:
            continue
        times = []
        while time.time() < w["end"]:
            t = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t)
        out[w["name"]] = {"n": len(times), "median_ms": statistics.median(times) * 1e3 if times else None,
                          "mean_ms": statistics.fmean(times) * 1e3 if times else None}  # fmt: skip
    return out


def _wait_schedule(run_dir: Path) -> list[dict]:
    path = run_dir / "schedule.json"
    deadline = time.time() + STARTUP_TIMEOUT_S + 30
    while not path.is_file():
        if time.time() > deadline:
            raise TimeoutError("no schedule")
        time.sleep(0.05)
    return json.loads(path.read_text())


def worker(role: str, run_dir: Path, device: str, green_sms: int | None) -> None:
    import torch

    dev = torch.device(device)
    if role == "both":  # green contexts: one process, a thread and a green-context stream per model
        from flashinfer.green_ctx import split_device_green_ctx_by_sm_count

        index = dev.index if dev.index is not None else torch.cuda.current_device()
        streams, resources = split_device_green_ctx_by_sm_count(torch.device("cuda", index), [green_sms])
        sms = [int(r.sm.smCount) for r in resources]
        per_stream = {"draft": streams[0], "target": streams[1]}
        torch.cuda.synchronize = lambda device=None: torch.cuda.current_stream().synchronize()  # see docstring
        steps = {}
        for r in ("draft", "target"):
            with torch.cuda.stream(per_stream[r]):
                steps[r] = _workload(r, device)[1]
                for _ in range(3):
                    steps[r]()
                per_stream[r].synchronize()
        (run_dir / "ready-both").write_text("1")
        windows = _wait_schedule(run_dir)
        results: dict = {}

        def run(r: str) -> None:
            with torch.cuda.stream(per_stream[r]):
                results[r] = _run_windows(r, steps[r], windows, per_stream[r].synchronize)

        threads = [threading.Thread(target=run, args=(r,)) for r in ("draft", "target")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        (run_dir / "result-both.json").write_text(json.dumps({"sms": sms, **results}))
        return
    name, step = _workload(role, device)
    for _ in range(3):  # warm-up: kernels, allocator
        step()
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    (run_dir / f"ready-{role}").write_text(name)
    windows = _wait_schedule(run_dir)
    (run_dir / f"result-{role}.json").write_text(json.dumps(_run_windows(role, step, windows, sync)))


# ----------------------------------------------------------------------------- the orchestrator (stdlib)


def mps_start(root: Path) -> tuple[dict[str, str] | None, str]:
    """Start an MPS control daemon with its own pipe/log directories; (env for its clients, or None, why)."""
    binary = shutil.which("nvidia-cuda-mps-control")
    if binary is None:
        return None, "nvidia-cuda-mps-control not found"
    pipe, logs = root / "pipe", root / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
    try:
        done = subprocess.run([binary, "-d"], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not start the MPS daemon: {exc}"
    if done.returncode != 0:
        return None, f"nvidia-cuda-mps-control -d exit {done.returncode}: {(done.stdout + done.stderr)[-500:]}"
    deadline = time.monotonic() + 10
    while not (pipe / "control").exists():
        if time.monotonic() > deadline:
            return None, "MPS daemon started but no control pipe appeared"
        time.sleep(0.1)
    return env, "started"


def mps_stop(env: dict[str, str] | None) -> None:
    if env is None:
        return
    try:
        subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _compute_apps() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
                              capture_output=True, text=True, timeout=15).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""


def run_mode(mode: str, roles: dict[str, dict[str, str]], *, window_s: float, device: str, log_dir: Path,
             green_sms: int | None = None) -> dict:  # fmt: skip
    """Start one worker per entry of ``roles`` (role -> extra env), schedule the three windows, collect."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"tandem-split-{mode}-"))
    procs = {}
    for role, extra in roles.items():
        cmd = [sys.executable, "-m", "bench.gpu.sm_split", "worker", "--role", role, "--dir", str(run_dir),
               "--device", device] + (["--green-sms", str(green_sms)] if green_sms else [])  # fmt: skip
        log = open(log_dir / f"sm_split-{mode}-{role}.log", "ab")
        procs[role] = subprocess.Popen(cmd, env={**os.environ, **extra}, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not all((run_dir / f"ready-{r}").exists() for r in roles):
            dead = [r for r, p in procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{mode}: worker {dead[0]} exited with {procs[dead[0]].returncode} while loading")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: workers not ready in {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        t = time.time() + 1.0
        windows = [{"name": "draft_alone", "start": t, "end": t + window_s, "active": ["draft"]},
                   {"name": "target_alone", "start": t + window_s, "end": t + 2 * window_s, "active": ["target"]},
                   {"name": "both", "start": t + 2 * window_s, "end": t + 3 * window_s, "active": ["draft", "target"]}]  # fmt: skip
        (run_dir / "schedule.json").write_text(json.dumps(windows))
        time.sleep(max(0.0, t + 2.5 * window_s - time.time()))
        apps = _compute_apps()
        for role, proc in procs.items():
            proc.wait(timeout=3 * window_s + 60)
            if proc.returncode != 0:
                raise RuntimeError(f"{mode}: worker {role} exited with {proc.returncode}")
        res = {r: json.loads((run_dir / f"result-{r}.json").read_text()) for r in roles}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(run_dir, ignore_errors=True)
    if "both" in res:
        res = {"draft": res["both"]["draft"], "target": res["both"]["target"], "sms": res["both"]["sms"]}
    row = {
        "mode": mode,
        "draft_ms": res["draft"]["both"]["median_ms"], "target_ms": res["target"]["both"]["median_ms"],
        "draft_alone_ms": res["draft"]["draft_alone"]["median_ms"],
        "target_alone_ms": res["target"]["target_alone"]["median_ms"],
        "steps": {r: {w: v["n"] for w, v in res[r].items()} for r in ("draft", "target")},
        "compute_apps": apps.strip().splitlines()[1:],
    }  # fmt: skip
    if "sms" in res:
        row["sms"] = res["sms"]
    return row


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        p = argparse.ArgumentParser(prog="python -m bench.gpu.sm_split worker")
        p.add_argument("--role", choices=("draft", "target", "both"), required=True)
        p.add_argument("--dir", type=Path, required=True)
        p.add_argument("--device", default="cuda")
        p.add_argument("--green-sms", type=int, default=None)
        a = p.parse_args(argv[1:])
        worker(a.role, a.dir, a.device, a.green_sms)
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.sm_split")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=150.0)
    parser.add_argument("--window-s", type=float, default=5.0)
    parser.add_argument("--mps-shares", default="50,25", help="draft percentages under MPS")
    parser.add_argument("--green-sms", default="40", help="SMs of the draft's green context (multiples of 8)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    log_dir = args.out.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {"stage": "sm_split", "batch": BATCH, "chain": CHAIN, "context": CONTEXT, "window_s": args.window_s,
                 "modes": [], "errors": [], "mps": {"available": None}, "green_contexts": {"available": None}}  # fmt: skip
    per_mode_s = 3 * args.window_s + 35  # loading + the three windows

    def save() -> None:
        args.out.write_text(json.dumps(out, indent=2) + "\n")

    def attempt(mode: str, roles: dict, **kw) -> bool:
        if args.budget_s - (time.monotonic() - t0) < per_mode_s:
            out["errors"].append(f"{mode}: skipped, out of time")
            return False
        try:
            out["modes"].append(run_mode(mode, roles, window_s=args.window_s, device=args.device, log_dir=log_dir, **kw))
            print(json.dumps(out["modes"][-1])[:400], flush=True)
            return True
        except Exception as exc:  # noqa: BLE001 - recorded; the next mode still runs
            out["errors"].append(f"{mode}: {type(exc).__name__}: {exc}"[:1000])
            return False
        finally:
            save()

    if attempt("time-slicing", {"draft": {}, "target": {}}):
        alone = out["modes"][-1]
        out["modes"].insert(0, {"mode": "alone", "draft_ms": alone["draft_alone_ms"],
                                "target_ms": alone["target_alone_ms"]})  # fmt: skip
    green = [int(n) for n in args.green_sms.split(",") if n]
    for n in green[:1]:  # one green split right after the baseline: it needs no daemon
        try:
            import flashinfer.green_ctx  # noqa: F401

            out["green_contexts"] = {"available": True, "via": "flashinfer.green_ctx (CUDA driver green contexts)"}
            attempt(f"green-{n}", {"both": {}}, green_sms=n)
        except ImportError as exc:
            out["green_contexts"] = {"available": False, "reason": str(exc)}
    shares = [int(s) for s in args.mps_shares.split(",") if s]
    if shares and args.budget_s - (time.monotonic() - t0) >= per_mode_s:
        root = Path(tempfile.mkdtemp(prefix="tandem-mps-"))
        env, why = mps_start(root)
        out["mps"] = {"available": env is not None, "reason": why}
        try:
            if env is not None:
                mps_env = {k: env[k] for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}
                for r in shares:
                    attempt(f"mps-{r}/{100 - r}", {"draft": {**mps_env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(r)},
                                                   "target": {**mps_env,
                                                              "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(100 - r)}})  # fmt: skip
                out["mps"]["server_seen"] = any("mps-server" in line for m in out["modes"]
                                                for line in m.get("compute_apps", []))  # fmt: skip
        finally:
            mps_stop(env)
            out["mps"]["log"] = _read(root / "log" / "control.log")[-2000:]
            shutil.rmtree(root, ignore_errors=True)
    for n in green[1:]:
        attempt(f"green-{n}", {"both": {}}, green_sms=n)
    save()
    return 0 if out["modes"] else 1


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


if __name__ == "__main__":
    sys.exit(main())
