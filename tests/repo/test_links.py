"""Every relative link in README.md, docs/ and the results folders' READMEs resolves: the file exists, and
a #fragment names a heading of the file it points to (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its label
    text = re.sub(r"[*_~]{1,3}(\S(?:.*?\S)?)[*_~]{1,3}", r"\1", text)
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "bench").rglob("README.md"))]


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in _LINK.findall(doc.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file_part, _, fragment = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            broken.append(f"{doc.relative_to(ROOT)} -> {target} (no such file)")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{doc.relative_to(ROOT)} -> {target} (no such heading)")
    return broken


def test_every_relative_link_resolves_to_a_file_and_heading():
    broken = [b for doc in documents() for b in broken_links(doc)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_follows_githubs_rule():
    assert slug("Where the strong-draft runs stand (2026-11-29): what is met") == "where-the-strong-draft-runs-stand-2026-11-29-what-is-met"
    assert slug("FASER-AD's lengths, and `faser-joint`") == "faser-ads-lengths-and-faser-joint"
    assert slug("Configuration") == "configuration"


def test_a_missing_heading_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n[ok](#title) [bad](#nope) [file](b.md#x) [gone](c.md)\n")
    (tmp_path / "b.md").write_text("## X\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert broken_links(tmp_path / "a.md") == ["a.md -> #nope (no such heading)", "a.md -> c.md (no such file)"]
    finally:
        ROOT = saved
