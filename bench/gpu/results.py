"""Result files of `make gpu-check` / `make gpu-bench`: the summary, its highlights, packing and unpacking.

Standard library only (it runs on the GPU machine before anything is installed, and here in tests).

On the machine each command works in ``bench/results/gpu-<run>/`` of the repository copy and packs
it into at most four files under $OUT (the device tool brings back 8 files of at most 16 MiB)::

    $OUT/<run>-summary.json    the summary below (also inside the tarball)
    $OUT/<run>-log.txt         the command's own log
    $OUT/<run>-junit.xml       gpu-check: pytest's JUnit XML, both runs merged
    $OUT/<run>.tar.gz          everything: stage results, plots, logs, profiles

``python -m bench.gpu unpack DIR...`` (here) extracts each tarball into
``bench/results/gpu-<run>-<device>/`` (``gpu-check-h100``, ``gpu-bench-h200``) and prints the summary.

The summary::

    {"run": "check" | "bench", "version": 1, "started_at", "elapsed_s", "device": {...},
     "setup": {...}, "stages": [{"name", "status", "elapsed_s", "budget_s", "reason", "result", "log"}],
     "tests": {"passed", "failed", "skipped", "errors", "failures": [...]},       # check
     "measurements": {test name: {...}},                                            # check: what GPU tests record
     "highlights": {...}}                                                           # bench: from the stage results
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS_ROOT = REPO_ROOT / "bench" / "results"
SUMMARY_VERSION = 1
RUNS = ("check", "bench")
STATUSES = ("ok", "failed", "timeout", "skipped")
MAX_OUT_FILE_BYTES = 15 * 1024 * 1024  # the tool brings back files of at most 16 MiB
MEASUREMENTS_ENV = "TANDEM_GPU_MEASUREMENTS"  # a directory GPU tests write their measured figures into


class ResultError(ValueError):
    """A result file that does not have the expected shape."""


# ----------------------------------------------------------------------------- writing


def write_json(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def record_measurement(name: str, data: dict) -> None:
    """For GPU tests: keep a measured figure (errors, tolerances, margins) for the check's summary."""
    folder = os.environ.get(MEASUREMENTS_ENV)
    if folder:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        write_json(Path(folder) / f"{safe}.json", {"name": name, **data})


def read_measurements(folder: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[data.pop("name", path.stem)] = data
    return out


def junit_counts(paths: list[Path]) -> dict:
    """passed / failed / skipped / errors and the failing node ids over JUnit XML files."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": []}
    for path in paths:
        if not path.is_file():
            continue
        root = ET.parse(path).getroot()
        for case in root.iter("testcase"):
            node = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None:
                counts["failed"] += 1
                counts["failures"].append(node)
            elif case.find("error") is not None:
                counts["errors"] += 1
                counts["failures"].append(node)
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return counts


def merge_junit(paths: list[Path], out: Path) -> Path:
    """One <testsuites> document holding every suite of ``paths``."""
    merged = ET.Element("testsuites")
    for path in paths:
        if not path.is_file():
            continue
        root = ET.parse(path).getroot()
        merged.extend(root.iter("testsuite") if root.tag == "testsuites" else [root])
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)
    return out


def pack(work_dir: Path, out_dir: Path, run: str, *, log_file: Path | None = None,
         junit: Path | None = None) -> list[Path]:  # fmt: skip
    """Copy the summary (and log, junit) to ``out_dir`` and tar ``work_dir`` beside them, under the size limit."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    summary = work_dir / "summary.json"
    for src, name in ((summary, f"{run}-summary.json"), (log_file, f"{run}-log.txt"), (junit, f"{run}-junit.xml")):
        if src is not None and src.is_file():
            dst = out_dir / name
            _copy_tail(src, dst, MAX_OUT_FILE_BYTES)
            written.append(dst)
    tarball = out_dir / f"{run}.tar.gz"
    for limit in (None, 2 * 1024 * 1024, 256 * 1024):  # shrink the logs until it fits
        with tarfile.open(tarball, "w:gz") as tar:
            for path in sorted(work_dir.rglob("*")):
                if not path.is_file():
                    continue
                arc = str(path.relative_to(work_dir))
                if limit is not None and path.suffix in (".log", ".txt") and path.stat().st_size > limit:
                    tar.add(_tail_copy(path, limit), arcname=arc)
                else:
                    tar.add(path, arcname=arc)
        if tarball.stat().st_size <= MAX_OUT_FILE_BYTES:
            break
    written.append(tarball)
    return written


def _copy_tail(src: Path, dst: Path, limit: int) -> None:
    if src.stat().st_size <= limit:
        shutil.copyfile(src, dst)
    else:
        with open(src, "rb") as f:
            f.seek(-limit, os.SEEK_END)
            dst.write_bytes(f.read())


def _tail_copy(path: Path, limit: int) -> Path:
    tmp = Path("/tmp") / f"tandem-tail-{os.getpid()}-{path.name}"
    _copy_tail(path, tmp, limit)
    return tmp


# ----------------------------------------------------------------------------- reading


def validate_summary(summary: dict) -> dict:
    """Raise ResultError unless ``summary`` has the documented shape; returns it."""
    for key in ("run", "version", "started_at", "elapsed_s", "device", "stages"):
        if key not in summary:
            raise ResultError(f"summary has no {key!r}")
    if summary["run"] not in RUNS:
        raise ResultError(f"unknown run {summary['run']!r}")
    if summary["version"] != SUMMARY_VERSION:
        raise ResultError(f"summary version {summary['version']}, expected {SUMMARY_VERSION}")
    for st in summary["stages"]:
        for key in ("name", "status", "elapsed_s", "budget_s"):
            if key not in st:
                raise ResultError(f"stage record without {key!r}: {st}")
        if st["status"] not in STATUSES:
            raise ResultError(f"stage {st['name']}: unknown status {st['status']!r}")
    if summary["run"] == "check":
        tests = summary.get("tests")
        if not isinstance(tests, dict) or not {"passed", "failed", "skipped", "errors"} <= tests.keys():
            raise ResultError("a check summary needs tests: passed, failed, skipped, errors")
    return summary


def device_slug(device: dict) -> str:
    """A short folder name for the GPU: 'NVIDIA H100 80GB HBM3' -> 'h100'; 'cpu' without one."""
    name = (device.get("gpu") or {}).get("name") or device.get("name") or ""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Za-z]?)\b", name)
    if m:
        return m.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "cpu"


def unpack(folders: list[Path], results_root: Path = RESULTS_ROOT, log=print) -> list[Path]:
    """Extract each run found in ``folders`` (files_at of the device calls) into results_root/gpu-<run>-<device>/.

    A later call of the same run on the same GPU kind (``bench --stages slo``) is merged in: its files
    overwrite those of the same name, every summary is kept under summaries/, and summary.json is the
    merge (per stage the latest successful record, else the latest; highlights read again from the files).
    """
    done = []
    for folder in folders:
        for summary_path in sorted(Path(folder).rglob("*-summary.json")):
            summary = validate_summary(json.loads(summary_path.read_text()))
            run = summary["run"]
            dest = results_root / f"gpu-{run}-{device_slug(summary['device'])}"
            dest.mkdir(parents=True, exist_ok=True)
            tarball = summary_path.with_name(f"{run}.tar.gz")
            if tarball.is_file():
                with tarfile.open(tarball) as tar:
                    tar.extractall(dest, filter="data")
            stamp = re.sub(r"[^0-9A-Za-z]+", "", summary["started_at"])[:15]
            for name in (f"{run}-log.txt", f"{run}-junit.xml"):
                if (summary_path.parent / name).is_file():
                    shutil.copyfile(summary_path.parent / name, dest / name.removeprefix(f"{run}-"))
            (dest / "summaries").mkdir(exist_ok=True)
            shutil.copyfile(summary_path, dest / "summaries" / f"{stamp}.json")
            merged = merge_summaries([json.loads(p.read_text()) for p in sorted((dest / "summaries").glob("*.json"))])
            if run == "bench":
                merged["highlights"] = highlights(dest, merged["stages"])
            write_json(dest / "summary.json", merged)
            log(f"{summary_path.parent} -> {dest}")
            log(format_summary(merged))
            done.append(dest)
    return done


def merge_summaries(summaries: list[dict]) -> dict:
    """One summary from several calls of the same run, oldest first (see ``unpack``)."""
    summaries = sorted(summaries, key=lambda x: x["started_at"])
    merged = dict(summaries[-1])
    stages: dict[str, dict] = {}
    for summary in summaries:
        for st in summary["stages"]:
            old = stages.get(st["name"])
            if old is None or st["status"] == "ok" or old["status"] != "ok":
                stages[st["name"]] = st
    merged["stages"] = list(stages.values())
    merged["calls"] = [{"started_at": x["started_at"], "elapsed_s": x["elapsed_s"],
                        "stages": [st["name"] for st in x["stages"]]} for x in summaries]  # fmt: skip
    if not merged.get("device"):
        merged["device"] = next((x["device"] for x in reversed(summaries) if x.get("device")), {})
    left = [st["name"] for st in merged["stages"]
            if st["status"] in ("skipped", "timeout") and st["name"] not in ("device", "warm")]  # fmt: skip
    merged["rerun"] = (f"PYTHONUNBUFFERED=1 python3 -m bench.gpu bench --stages {','.join(left)}"
                       if left and merged["run"] == "bench" else None)  # fmt: skip
    return merged


# ----------------------------------------------------------------------------- highlights


def highlights(work_dir: Path, stages: list[dict]) -> dict:
    """The headline figures of a bench run, read from each finished stage's result file."""
    out = {}
    readers = {"verify_curve": verify_curve_highlights, "decode": decode_highlights, "sm_split": sm_split_highlights,
               "slo": slo_highlights, "faser": faser_highlights}  # fmt: skip
    for st in stages:
        reader = readers.get(st["name"])
        path = work_dir / st["result"] if st.get("result") else None
        if reader is None or path is None or not path.is_file():
            continue
        try:
            out[st["name"]] = reader(json.loads(path.read_text()))
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            out[st["name"]] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def verify_curve_highlights(data: dict) -> list[dict]:
    """Per model and backend: the budget B, how it was found, T(1), T(B) and T at the sweep's end."""
    rows = []
    for c in data["curves"]:
        sweep = sorted(c["sweep"])
        rows.append({"model": c["model"], "backend": c["backend"], "B": c["budget"], "method": c["method"],
                     "t1_ms": round(sweep[0][1] * 1e3, 3), "tB_ms": round(c["tB_ms"], 3),
                     "t_max_ms": round(sweep[-1][1] * 1e3, 3), "n_max": sweep[-1][0]})  # fmt: skip
    return rows


def decode_highlights(data: dict) -> list[dict]:
    return [{"backend": r["backend"], "batch": r["batch"], "tandem_tok_s": round(r["tandem_tok_s"], 1),
             "hf_tok_s": round(r["hf_tok_s"], 1), "ratio": round(r["tandem_tok_s"] / r["hf_tok_s"], 3)}
            for r in data["rows"]]  # fmt: skip


def sm_split_highlights(data: dict) -> dict:
    """Per mode: draft and target step times and the pipelined round max(draft, target) vs the serial sum alone."""
    modes = {m["mode"]: m for m in data["modes"]}
    alone = modes.get("alone")
    serial = alone["draft_ms"] + alone["target_ms"] if alone else None
    rows = []
    for name, m in modes.items():
        row = {"mode": name, "draft_ms": round(m["draft_ms"], 3), "target_ms": round(m["target_ms"], 3)}
        if name != "alone":
            row["round_ms"] = round(max(m["draft_ms"], m["target_ms"]), 3)
            if serial:
                row["round_vs_serial"] = round(row["round_ms"] / serial, 3)
        rows.append(row)
    best = min((r for r in rows if "round_ms" in r), key=lambda r: r["round_ms"], default=None)
    return {"serial_ms": None if serial is None else round(serial, 3), "modes": rows,
            "best": best and best["mode"], "mps": data.get("mps"), "green_contexts": data.get("green_contexts")}  # fmt: skip


BASELINES = ("target-only", "tandem-k3", "policy:specinfer", "policy:equal_greedy", "policy:global_greedy")


def slo_highlights(data: dict, ours: str = "policy:adaserve", threshold: float = 0.7) -> dict:
    """AdaServe's goal: attainment >= 1.3x the best baseline at every load where that baseline is < 70 %."""
    loads = []
    for phase in ("sweep", "mix"):
        for load, configs in (data.get(phase) or {}).items():
            att = {name: c["summary"]["attainment"] for name, c in configs.items() if c.get("summary")}
            if ours not in att:
                continue
            base = {k: v for k, v in att.items() if k != ours}
            best_name = max(base, key=base.get) if base else None
            best = base.get(best_name) if best_name else None
            row = {"phase": phase, "load": load, "ours": att[ours], "best_baseline": best_name, "baseline": best}
            if best is not None and best < threshold:
                row["ratio"] = None if best == 0 else round(att[ours] / best, 3)
                row["goal_met"] = best == 0 and att[ours] > 0 or (best > 0 and att[ours] >= 1.3 * best)
            loads.append(row)
    judged = [r for r in loads if "goal_met" in r]
    return {"loads": loads, "judged": len(judged), "goal_met": all(r["goal_met"] for r in judged) if judged else None,
            "partial": bool(data.get("partial"))}  # a stage stopped at its budget: what it measured before


def faser_highlights(data: dict, base: str = "faser:serial", ours: str = "faser:all") -> dict:
    """FASER's goal: pipelining + early exit >= 15 % lower TPOT than serial SD at batch 1."""
    tpot = {name: c["summary"]["tpot_s"]["mean"] * 1e3 for name, c in (data.get("batch1") or {}).items()
            if c.get("summary") and c["summary"].get("tpot_s")}  # fmt: skip
    out = {"tpot_ms": {k: round(v, 3) for k, v in tpot.items()}, "partial": bool(data.get("partial"))}
    if base in tpot and ours in tpot:
        change = tpot[ours] / tpot[base] - 1.0
        out["all_vs_serial"] = round(change, 4)
        out["goal_met"] = change <= -0.15
    return out


def format_summary(summary: dict) -> str:
    """A short text table: the device, each stage, tests, highlights (the end of a call's output)."""
    dev = summary.get("device") or {}
    gpu = dev.get("gpu") or {}
    lines = [f"gpu-{summary['run']} on {gpu.get('name', dev.get('name', '?'))} "
             f"(driver {gpu.get('driver', '?')}, torch {dev.get('torch', '?')}, CUDA {dev.get('cuda', '?')}, "
             f"flashinfer {dev.get('flashinfer', '?')}): {summary['elapsed_s']:.0f} s"]  # fmt: skip
    for st in summary["stages"]:
        lines.append(f"  {st['name']:<16} {st['status']:<8} {st['elapsed_s']:>6.0f} s / {st['budget_s']:>4.0f} s"
                     + (f"  {st['reason'][:150]}" if st.get("reason") else ""))  # fmt: skip
    if tests := summary.get("tests"):
        lines.append(f"  tests: {tests['passed']} passed, {tests['failed']} failed, {tests['errors']} errors, "
                     f"{tests['skipped']} skipped")  # fmt: skip
        for node in tests.get("failures", [])[:10]:
            lines.append(f"    FAILED {node}")
    for name, data in (summary.get("measurements") or {}).items():
        lines.append(f"  {name}: {json.dumps(data, default=str)[:200]}")
    for name, data in (summary.get("highlights") or {}).items():
        lines.append(f"  {name}: {json.dumps(data, default=str)[:400]}")
    if summary.get("rerun"):
        lines.append(f"  skipped stages can run in another call: {summary['rerun']}")
    return "\n".join(lines)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
