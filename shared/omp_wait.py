"""How OpenMP threads wait between parallel regions on CPU: set before torch loads libgomp.

    apply_defaults(env)   OMP_WAIT_POLICY=PASSIVE and GOMP_SPINCOUNT=10000 unless ``env`` sets them

A forward of a small model is thousands of short parallel regions. Threads that sleep at once
(PASSIVE alone) pay a wake-up at each; threads that spin long (libgomp's default 300,000 spins)
starve the other model service sharing the cores. A short spin (~0.1 ms) is both: the launcher
gives the services it starts this setting, and every entry point that runs a model in its own
process (`tandem profile`, the benchmarks) must give itself the same, or what it measures is not
what the services run. Measured on the 2-core Intel Xeon (SmolLM2-135M, bf16, one verify forward,
median): PASSIVE alone 77 ms at batch 1 and 108 ms at batch 4; with the short spin 54 and 63 ms
(2026-11-27; `tandem profile` run outside make had fitted T(1) = 79 ms against the services' ~54).

libgomp reads these variables once, when it is loaded (``import torch``): setting them later in
the same process changes nothing, hence ``apply_defaults`` at the top of the entry points.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

SPINCOUNT = "10000"  # libgomp spins before a waiting thread sleeps: ~0.1 ms


def apply_defaults(env: MutableMapping[str, str] | None = None) -> MutableMapping[str, str]:
    """Give ``env`` (default: this process's environment) the services' OpenMP wait unless it sets its own."""
    env = os.environ if env is None else env
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env.setdefault("GOMP_SPINCOUNT", SPINCOUNT)
    return env
