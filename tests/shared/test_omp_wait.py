"""The OpenMP wait every entry point gives itself before torch loads: the services' setting."""

import os
import subprocess
import sys
from pathlib import Path

from shared.omp_wait import SPINCOUNT, apply_defaults

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_fill_only_what_is_unset():
    assert apply_defaults({}) == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SPINCOUNT}
    mine = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5"}
    assert apply_defaults(dict(mine)) == mine


def test_entry_points_set_it_before_torch_loads():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(ROOT)
    for module in ("bench", "sdk.cli"):
        code = (f"import sys, os; import {module}; assert 'torch' not in sys.modules; "
                "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])")  # fmt: skip
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["PASSIVE", SPINCOUNT], module


def test_the_launcher_gives_the_services_the_same():
    from services.launcher import LaunchConfig, _env

    env = _env(LaunchConfig(), "127.0.0.1:5000")
    assert env["GOMP_SPINCOUNT"] == os.environ.get("GOMP_SPINCOUNT", SPINCOUNT)
