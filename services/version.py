"""The version every service reports in its Info (kept apart so the scheduler need not import the engine)."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def service_version() -> str:
    """The installed package's version; in a plain checkout, pyproject's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tandem")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"
