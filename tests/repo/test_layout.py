"""The module layout's promises: one error hierarchy with gRPC codes, a scheduling core free of I/O libraries."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import grpc

import services.scheduler.errors as request_errors
import shared.engine.errors as engine_errors
from shared.errors import TandemError

ROOT = Path(__file__).resolve().parents[2]
IO_LIBRARIES = ("grpc", "redis", "opentelemetry", "shared.rpc", "services")


def _classes(module) -> list[type]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]


def test_engine_and_request_errors_share_one_root_and_name_real_status_codes():
    classes = _classes(engine_errors) + _classes(request_errors)
    assert len(classes) >= 14
    for cls in classes:
        assert issubclass(cls, TandemError), cls
        assert cls.grpc_code in grpc.StatusCode.__members__, (cls, cls.grpc_code)


def test_request_errors_still_refine_their_builtins():
    assert issubclass(request_errors.TandemRequestError, ValueError)
    assert issubclass(request_errors.UnknownRequestError, LookupError)
    assert issubclass(request_errors.QueueFullError, RuntimeError)


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_scheduling_core_imports_no_grpc_redis_or_opentelemetry():
    """scheduler/ is the loop and its policies; the service around it (services/scheduler/) does the I/O."""
    found = [f"{p.relative_to(ROOT)}: {name}" for p in sorted((ROOT / "scheduler").rglob("*.py"))
             for name in sorted(_imported(p)) if any(name == lib or name.startswith(lib + ".") for lib in IO_LIBRARIES)]  # fmt: skip
    assert not found, "I/O imports in the scheduling core:\n" + "\n".join(found)


def test_every_architecture_reference_in_the_code_names_a_section_of_it():
    """Code cites the design as ``architecture.md §N``: each N is a numbered section of docs/architecture.md."""
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "architecture.md").read_text(), re.M))
    assert sections == {str(n) for n in range(1, 9)}
    cited = {}
    for path in [*ROOT.glob("*/**/*.py"), *ROOT.glob("**/*.md")]:
        if "gen" in path.parts or ".venv" in path.parts:
            continue
        for n in re.findall(r"architecture\.md §(\d+)", path.read_text(encoding="utf-8", errors="replace")):
            cited.setdefault(n, []).append(str(path.relative_to(ROOT)))
    assert len(cited) >= 5
    unknown = {n: files for n, files in cited.items() if n not in sections}
    assert not unknown, f"references to sections architecture.md does not have: {unknown}"


def test_bench_results_hold_one_current_folder_per_benchmark_and_regime():
    """At most 30 entries, each a folder with its README (command, machine, date); diagnostics live apart."""
    entries = sorted((ROOT / "bench" / "results").iterdir())
    assert len(entries) <= 30, [e.name for e in entries]
    folders = [e for e in entries if e.is_dir()]
    assert not [f.name for f in folders if not (f / "README.md").is_file()]
    assert not [f.name for f in folders if f.name.startswith("diag-")]
    assert (ROOT / "bench" / "diagnostics" / "README.md").is_file()
