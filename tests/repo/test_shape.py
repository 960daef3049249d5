"""The codebase's shape: a README that is an entry point, no import cycles between the project's
modules (imports inside functions included), no source file over 600 lines. Links: test_links.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "services", "scheduler", "sdk", "bench")
MAX_LINES = 600


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "gen" not in p.relative_to(ROOT).parts)


def test_readme_is_short_and_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first_block = re.search(r"```[^\n]*\n(.*?)```", text, re.S).group(1)
    assert [line.strip() for line in first_block.strip().splitlines()] == ["make demo", "make test"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` runs only when the file is a script, never when it is imported."""
    return isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules this file imports, anywhere: at module level and inside functions (an import run at call
    time closes a cycle as surely as one at import time). Left out: `if TYPE_CHECKING:` (never runs) and
    `if __name__ == "__main__":` (runs only as a script)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.unparse(node.test) or _is_main_guard(node)):
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    found.add(sub)  # `from pkg import module`
                elif base in modules:
                    found.add(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(here)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := dfs(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := dfs(node)):
            return found
    return None


def test_no_import_cycles_between_project_modules():
    files = {_module_name(p): p for p in _sources()}
    modules = set(files)
    # a package's __init__ imports are edges from the package; importing a submodule runs its package first
    graph = {name: _imports(path, modules) for name, path in files.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_finds_one():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_source_file_over_600_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "files over 600 lines:\n" + "\n".join(long)
