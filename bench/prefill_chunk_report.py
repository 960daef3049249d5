"""Chunked vs one-piece prefill under load, from a harness run's results (configurations ``chunk:<N|off>:<c>``).

For each open-loop load point and each configuration <c> run both ways, per repeat: SLO attainment of all
requests, of the traffic the long prompts interrupt (every class but ``long``), the p99 TPOT of that traffic,
and the long prompts' mean TTFT. results_readme appends the table to the folder's README.md.
"""

from __future__ import annotations

import re

_CHUNK = re.compile(r"chunk:(off|\d+):(.+)")


def pairs(configs: list[str]) -> list[tuple[str, str, str]]:
    """(base, chunked, one-piece) for every base configuration present both chunked and in one piece."""
    by_base: dict[str, dict[str, str]] = {}
    for name in configs:
        if m := _CHUNK.fullmatch(name):
            by_base.setdefault(m.group(2), {})["off" if m.group(1) == "off" else "on"] = name
    return [(b, d["on"], d["off"]) for b, d in by_base.items() if {"on", "off"} <= d.keys()]


def _others(run: dict) -> tuple[float | None, float | None, float | None]:
    """(attainment, p99 TPOT of the worst class, long TTFT) of one repeat, long prompts set apart."""
    by = run.get("by_class") or {}
    rest = {c: v for c, v in by.items() if c != "long"}
    n = sum(v["requests"] for v in rest.values())
    attained = sum(v["attained"] for v in rest.values()) / n if n else None
    tpots = [v["tpot_p99_s"] for v in rest.values() if v["tpot_p99_s"] is not None]
    long = by.get("long") or {}
    return attained, max(tpots) if tpots else None, long.get("ttft_mean_s")


def rows(results: dict) -> list[dict]:
    out = []
    for load, per in (results.get("sweep") or {}).items():
        for base, on, off in pairs(list(per)):
            row = {"load": load, "config": base}
            for tag, name in (("chunked", on), ("one_piece", off)):
                runs = sorted(per[name]["by_run"], key=lambda r: r["repeat"])
                row[tag] = [{"attainment": r["attainment"], **dict(zip(("attainment_others", "tpot_p99_others_s",
                             "long_ttft_mean_s"), _others(r)))} for r in runs]  # fmt: skip
            out.append(row)
    return out


def _f(x, spec=".2f", scale=1.0) -> str:
    return "–" if x is None else format(x * scale, spec)


def _series(runs: list[dict], key: str, spec: str, scale: float = 1.0) -> str:
    return " / ".join(_f(r[key], spec, scale) for r in runs)


def section(results: dict) -> list[str]:
    """README lines: one row per (load, configuration), each cell the repeats' values in order."""
    found = rows(results)
    if not found:
        return []
    lines = ["", "## Chunked vs one-piece prefill", "",
             "Each cell: the repeats in order (chunked | one-piece). 'others': every request but the long prompts.", "",
             "| load | config | attainment (all) | attainment (others) | p99 TPOT, worst class of the others (ms) | long-prompt TTFT (s) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in found:
        cells = [f"{_series(r['chunked'], k, s, x)} \\| {_series(r['one_piece'], k, s, x)}"
                 for k, s, x in (("attainment", ".2f", 1), ("attainment_others", ".2f", 1),
                                 ("tpot_p99_others_s", ".0f", 1e3), ("long_ttft_mean_s", ".1f", 1))]  # fmt: skip
        lines.append(f"| {r['load']} | {r['config']} | " + " | ".join(cells) + " |")
    return lines
