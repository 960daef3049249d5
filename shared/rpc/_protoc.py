"""Build the Python code generated from ``protos/`` into ``shared/rpc/gen/``.

The command line is ``python -m shared.rpc.build`` (see build.py); this module
holds the logic so that importing ``shared.rpc`` can run it without importing
the CLI module.

Layout (``gen/`` is gitignored; generated code is built, never committed)::

    protos/tandem/v1/common.proto   ->  shared/rpc/gen/tandem/v1/common_pb2.py (+ .pyi)
    protos/tandem/v1/draft.proto    ->  shared/rpc/gen/tandem/v1/draft_pb2.py, draft_pb2_grpc.py
    ...

protoc runs with ``-I protos``, so descriptors are registered under their
canonical names (``tandem/v1/common.proto``), and the imports it writes
(``from tandem.v1 import common_pb2``) are rewritten to absolute imports of this
package (``from shared.rpc.gen.tandem.v1 import common_pb2``). Nothing is put on
``sys.path``, and there is no top-level ``tandem`` module to collide with.

A stamp (hash of the .proto files and the protoc/protobuf versions) makes the
build a no-op when up to date. Concurrent builders (several services starting
at once in a fresh clone) serialise on a file lock, and the new tree is moved
into place with renames, so a reader never sees a half-written package.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Bump when the layout or the import rewriting changes, to force a rebuild.
_BUILD_FORMAT = "2"

RPC_DIR = Path(__file__).resolve().parent
GEN_DIR = RPC_DIR / "gen"
PROTO_DIR = RPC_DIR.parents[1] / "protos"
# Import path of the generated package, derived from where this module lives.
GEN_PACKAGE = f"{__name__.rsplit('.', 1)[0]}.gen"

_GEN_INIT = '"""Code generated from protos/ by `python -m shared.rpc.build`. Do not edit; not committed."""\n'


class ProtoBuildError(RuntimeError):
    """protoc failed, or there is neither generated code nor .proto sources to build it from."""


def proto_files(proto_dir: Path = PROTO_DIR) -> list[Path]:
    """All .proto files under ``proto_dir``, sorted."""
    return sorted(proto_dir.rglob("*.proto"))


def _stamp(proto_dir: Path) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    def version(name: str) -> str:
        try:
            return _version(name)
        except PackageNotFoundError:  # e.g. a runtime image without grpcio-tools: trust the stamp's sources
            return ""

    h = hashlib.sha256()
    h.update(f"format={_BUILD_FORMAT};pkg={GEN_PACKAGE};".encode())
    h.update(f"protobuf={version('protobuf')};grpcio-tools={version('grpcio-tools')};".encode())
    for path in proto_files(proto_dir):
        h.update(str(path.relative_to(proto_dir)).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def is_up_to_date(proto_dir: Path = PROTO_DIR, gen_dir: Path = GEN_DIR) -> bool:
    """True when ``gen_dir`` holds code built from the current .proto files."""
    stamp = gen_dir / ".stamp"
    if not stamp.exists() or not any(gen_dir.rglob("*_pb2.py")):
        return False
    if not proto_dir.is_dir():  # installed without sources: trust what was built
        return True
    return stamp.read_text().strip() == _stamp(proto_dir)


_IMPORT_RE = re.compile(r"^(\s*)(from|import) tandem\.v1\b", re.MULTILINE)
# The module name protoc bakes into message classes (their __module__, which pickle follows).
_MODULE_RE = re.compile(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'tandem\.v1\.")


def _rewrite_imports(root: Path) -> None:
    """``from tandem.v1 import x_pb2`` -> ``from shared.rpc.gen.tandem.v1 import x_pb2``.

    Only import lines and the module name are touched; proto names such as
    ``/tandem.v1.DraftService/Prefill`` stay as they are.
    """
    for path in root.rglob("*"):
        if path.suffix not in (".py", ".pyi"):
            continue
        text = path.read_text()
        new = _IMPORT_RE.sub(lambda m: f"{m.group(1)}{m.group(2)} {GEN_PACKAGE}.tandem.v1", text)
        new = _MODULE_RE.sub(lambda m: f"{m.group(1)}'{GEN_PACKAGE}.tandem.v1.", new)
        if new != text:
            path.write_text(new)


def _run_protoc(proto_dir: Path, out_dir: Path) -> None:
    files = [str(p.relative_to(proto_dir)) for p in proto_files(proto_dir)]
    if not files:
        raise ProtoBuildError(f"no .proto files under {proto_dir}")
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *files,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=proto_dir)
    if proc.returncode != 0:
        raise ProtoBuildError(f"protoc failed ({proc.returncode}):\n{proc.stderr.strip()}")


def build(force: bool = False, proto_dir: Path = PROTO_DIR, gen_dir: Path = GEN_DIR) -> bool:
    """Generate the code if stale (or ``force``); returns True when it built."""
    if not force and is_up_to_date(proto_dir, gen_dir):
        return False
    if not force and importlib.util.find_spec("grpc_tools") is None and any(gen_dir.rglob("*_pb2.py")):
        return False  # a runtime install without grpcio-tools: use the code that was built
    if not proto_dir.is_dir():
        raise ProtoBuildError(
            f"generated code missing in {gen_dir} and no protos at {proto_dir}; "
            "build it from a source checkout with `python -m shared.rpc.build`"
        )
    gen_dir.mkdir(parents=True, exist_ok=True)
    with open(gen_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not force and is_up_to_date(proto_dir, gen_dir):
                return False  # someone else built it while we waited
            stamp = _stamp(proto_dir)
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=gen_dir))
            try:
                _run_protoc(proto_dir, tmp)
                for pkg in [p for p in tmp.rglob("*") if p.is_dir()]:
                    (pkg / "__init__.py").touch()
                _rewrite_imports(tmp)
                (gen_dir / ".stamp").unlink(missing_ok=True)
                (gen_dir / "__init__.py").write_text(_GEN_INIT)
                for top in tmp.iterdir():  # protos/tandem -> gen/tandem, swapped by rename
                    dest = gen_dir / top.name
                    old = None
                    if dest.exists():
                        old = gen_dir / f".old-{os.getpid()}-{top.name}"
                        shutil.rmtree(old, ignore_errors=True)
                        dest.rename(old)
                    top.rename(dest)
                    if old is not None:
                        shutil.rmtree(old, ignore_errors=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            tmp_stamp = gen_dir / f".stamp.{os.getpid()}"
            tmp_stamp.write_text(stamp + "\n")
            tmp_stamp.replace(gen_dir / ".stamp")
            return True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
