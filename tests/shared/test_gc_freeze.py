"""What startup made is frozen out of the collector's passes, in a process's own entry point only
(shared/gc_freeze.py)."""

from __future__ import annotations

import subprocess
import sys


def test_freezing_after_startup_moves_what_is_alive_out_of_the_collectors_passes():
    code = ("import gc, json; from shared.gc_freeze import freeze_after_startup; "
            "kept = [[i] for i in range(1000)]; frozen = freeze_after_startup(); "
            "print(json.dumps([frozen, gc.get_count()[2], len(gc.get_objects(2)), gc.get_threshold()]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    frozen, _, oldest, threshold = eval(out.stdout)
    assert frozen > 1000  # the lists kept, and everything imported
    assert oldest < 100  # nothing left for a full pass to walk
    assert threshold == [20_000, 10, 10]  # the youngest generation collected every 20,000 allocations, not 700

