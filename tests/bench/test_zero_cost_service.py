"""bench.step_overhead end to end at its smallest: the zero-cost services answer the real servicers' Info
(the fields a real engine fills: prefix-cache counters, the shape chunk pricing reads) and both protocols step."""

from __future__ import annotations

import json
import subprocess
import sys


def test_step_overhead_measures_both_protocols_on_zero_cost_services():
    out = subprocess.run([sys.executable, "-m", "bench.step_overhead", "--repeats", "1", "--steps", "6",
                          "--cases", "decode:1,chain4:1:576", "--json"],
                         capture_output=True, text=True, timeout=240)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    got = {(r["protocol"], r["shape"], r["batch"], r["feature_width"]) for r in rows}
    assert got == {(p, s, 1, w) for p in ("unary", "stream") for s, w in (("decode", 0), ("chain4", 576))}
    for r in rows:
        assert r["step_ms"] > 0 and r["scheduler_bytes_per_step"] > 0, r
    by = {(r["protocol"], r["shape"]): r for r in rows}
    # the target pushes feature rows to the draft itself: they no longer cross the scheduler
    assert by[("stream", "chain4")]["scheduler_bytes_per_step"] < by[("unary", "chain4")]["scheduler_bytes_per_step"] / 10
