"""The GPU machine's side of the kit (bench/gpu/kit.py builds it here): stage each carried load, check
and assemble the payload (wheels + the demo GGUF), install the wheels into a site directory and
prepare the demo pair, so `python3 -m bench.gpu check|bench` run offline on a bare image.

    stage()   each call but the last: copy this call's load into stage_root()/<kit id>/ (sha256 checked)
    setup()   the last call: every part present? assemble, install (PYTHONPATH=site_dir()), prepare models
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.gpu.kit_files import DEFAULT_SITE, KIT_DIR, MANIFEST, MIB, PLAN, REPO_ROOT, SITE_ENV, sha256


def load_plan(kit_dir: Path = KIT_DIR) -> dict:
    return json.loads((kit_dir / PLAN).read_text())


# ----------------------------------------------------------------------------- on the GPU machine (stdlib only)


def stage_root() -> Path:
    return Path(os.environ.get("TANDEM_GPU_STAGE", Path.home() / ".cache" / "tandem-gpu-kit"))


def _carried_manifest(kit_dir: Path) -> dict | None:
    """The manifest of the loads present here; the newest kit's when earlier calls left older ones."""
    found = [json.loads(p.read_text()) for p in kit_dir.glob(f"load-*/{MANIFEST}")]
    if not found:
        return None
    return max(found, key=lambda m: m.get("created_ns", 0))


def stage(kit_dir: Path = KIT_DIR, log=print) -> dict:
    """Copy the parts of every load carried in this call into the staging directory, checking each.

    Returns {"kit_id", "dir", "staged": [load names], "missing": [load names]}.
    """
    manifest = _carried_manifest(kit_dir)
    if manifest is None:
        raise KitError(f"no load under {kit_dir}: carry one (.gpu-kit/load-N) with this call")
    dest = stage_root() / manifest["kit_id"]
    dest.mkdir(parents=True, exist_ok=True)
    for load in manifest["loads"]:
        src = kit_dir / load["name"]
        carried = src / MANIFEST
        if not carried.is_file() or json.loads(carried.read_text()).get("kit_id") != manifest["kit_id"]:
            continue  # not carried in this call (or left from an older kit)
        for part in load["files"]:
            target = dest / part["file"]
            if target.is_file() and target.stat().st_size == part["bytes"]:
                continue  # staged by an earlier call
            got = sha256(src / part["file"])
            if got != part["sha256"]:
                raise KitError(f"{src / part['file']}: sha256 {got[:12]} does not match the manifest")
            tmp = target.with_suffix(target.suffix + ".tmp")
            shutil.copyfile(src / part["file"], tmp)
            tmp.replace(target)
        (dest / f"{load['name']}.staged").write_text(json.dumps(load["files"]) + "\n")
        log(f"staged {load['name']} ({load['bytes'] / MIB:.1f} MiB) into {dest}")
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return staged_status(manifest, dest)


def staged_status(manifest: dict, dest: Path) -> dict:
    staged = [ld["name"] for ld in manifest["loads"] if (dest / f"{ld['name']}.staged").is_file()]
    missing = [ld["name"] for ld in manifest["loads"] if ld["name"] not in staged]
    return {"kit_id": manifest["kit_id"], "dir": str(dest), "staged": staged, "missing": missing}


class KitError(RuntimeError):
    """The kit is incomplete on this machine, or a file does not match the manifest."""


class NotStaged(KitError):
    """Some loads never reached this machine (a fresh machine: the stage calls must be repeated)."""


def assemble(manifest: dict, dest: Path, tandem_home: Path, log=print) -> list[Path]:
    """Join each blob's parts into ``tandem_home/<dest>`` (sha256 checked); skip those already there."""
    out = []
    for blob in manifest["blobs"]:
        target = tandem_home / blob["dest"]
        if target.is_file() and target.stat().st_size == blob["bytes"] and sha256(target) == blob["sha256"]:
            out.append(target)
            continue
        parts = sorted((p for ld in manifest["loads"] for p in ld["files"] if p["of"] == blob["name"]),
                       key=lambda p: p["index"])  # fmt: skip
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(target.suffix + ".partial")
        with open(tmp, "wb") as f:
            for p in parts:
                with open(dest / p["file"], "rb") as src:
                    shutil.copyfileobj(src, f, length=8 * MIB)
        got = sha256(tmp)
        if got != blob["sha256"]:
            tmp.unlink()
            raise KitError(f"{blob['name']}: reassembled sha256 {got[:12]} does not match the manifest")
        tmp.replace(target)
        log(f"assembled {target} ({blob['bytes'] / MIB:.1f} MiB)")
        out.append(target)
    return out


def site_dir() -> Path:
    return Path(os.environ.get(SITE_ENV) or DEFAULT_SITE)


def site_env(site: Path | None = None) -> dict[str, str]:
    """The environment that sees the installed wheels and the repository (for every child process)."""
    site = site or site_dir()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("COLUMNS", "160")  # the harness's rich tables, readable in the logs
    return env


def install_wheels(manifest: dict, dest: Path, site: Path | None = None, log=print) -> None:
    """pip install every carried wheel offline into ``site`` (once per kit: a marker records it)."""
    site = site or site_dir()
    marker = site / f".tandem-kit-{manifest['kit_id']}"
    if marker.is_file():
        return
    if site.exists():
        shutil.rmtree(site)
    wheels = [str(dest / w["file"]) for w in manifest["wheels"]]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--disable-pip-version-check", "--target", str(site), *wheels]  # fmt: skip
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"pip install --target {site} failed:\n{done.stderr[-3000:]}")
    marker.write_text(json.dumps({"wheels": [w["file"] for w in manifest["wheels"]]}) + "\n")
    log(f"installed {len(wheels)} wheels into {site} in {time.perf_counter() - t:.1f} s")


# Prepares the pairs offline from the assembled GGUF (and the committed draft weights).
_PREPARE = """
import sys
from rich.console import Console
from shared.models import registry
from shared.models.paths import Paths
for pair in sys.argv[1:]:
    registry.prepare(registry.get_pair(pair), Paths.resolve(), Console())
"""


def setup(kit_dir: Path = KIT_DIR, *, pairs: tuple[str, ...] = ("demo",), log=print, after_install=None) -> dict:
    """Everything before the tests and benchmarks, idempotent: stage, assemble, install, protos, models.

    ``after_install(env)`` runs once the wheels are importable (the check starts flashinfer's JIT
    compile there, to overlap the model preparation). Raises NotStaged when loads are missing (a
    fresh machine), KitError when a step fails. Returns timings and what was done.
    """
    t0 = time.perf_counter()
    timings = {}
    manifest = _carried_manifest(kit_dir)
    if manifest is not None:
        status = stage(kit_dir, log=log)
    else:
        # nothing carried in this call: use the newest staged kit, if any
        staged = sorted(stage_root().glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime)
        if not staged:
            raise NotStaged("no kit on this machine and none carried: stage the loads first")
        manifest = json.loads(staged[-1].read_text())
        status = staged_status(manifest, staged[-1].parent)
    if status["missing"]:
        raise NotStaged(f"not staged on this machine: {', '.join(status['missing'])} (a fresh machine, or "
                        f"stage calls skipped); run the stage calls for them, then this call again")  # fmt: skip
    dest = Path(status["dir"])
    timings["stage_s"] = round(time.perf_counter() - t0, 1)
    home = Path(os.environ.get("TANDEM_HOME") or Path.home() / ".cache" / "tandem")
    assemble(manifest, dest, home, log=log)
    timings["assemble_s"] = round(time.perf_counter() - t0 - timings["stage_s"], 1)
    install_wheels(manifest, dest, log=log)
    env = site_env()
    if after_install is not None:
        after_install(env)
    t = time.perf_counter()
    _run([sys.executable, "-m", "shared.rpc.build"], env, "protos")
    timings["protos_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    _run([sys.executable, "-c", _PREPARE, *pairs], env, "tandem models prepare")
    timings["models_s"] = round(time.perf_counter() - t, 1)
    timings["total_s"] = round(time.perf_counter() - t0, 1)
    log(f"setup done in {timings['total_s']} s ({timings})")
    return {"kit_id": manifest["kit_id"], "timings": timings, "pairs": list(pairs), "site": str(site_dir())}


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise KitError(f"{what} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
