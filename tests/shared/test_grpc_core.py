"""TANDEM_GRPC_IO: gRPC's I/O path, set before grpc is imported (shared/grpc_core.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from shared.grpc_core import IOMGR, choose_io_path


def test_eventengine_keeps_grpcs_own_choice():
    env = {"TANDEM_GRPC_IO": "eventengine"}
    assert choose_io_path(env) is None and "GRPC_EXPERIMENTS" not in env


def test_iomgr_the_default_turns_the_event_engine_off_unless_grpc_experiments_is_set():
    for env in ({"TANDEM_GRPC_IO": "iomgr"}, {}):
        assert choose_io_path(env) == IOMGR == env["GRPC_EXPERIMENTS"]
    env = {"TANDEM_GRPC_IO": "iomgr", "GRPC_EXPERIMENTS": "-event_engine_client"}
    assert choose_io_path(env) == "-event_engine_client"


def test_an_unknown_choice_is_an_error_naming_the_variable():
    with pytest.raises(ValueError, match="TANDEM_GRPC_IO"):
        choose_io_path({"TANDEM_GRPC_IO": "epoll"})


def test_importing_the_services_applies_it_before_grpc_is_imported():
    code = "import os, sys, services; print('grpc' in sys.modules, os.environ.get('GRPC_EXPERIMENTS'))"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | {"TANDEM_GRPC_IO": "iomgr"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", IOMGR]


def test_a_bad_value_does_not_stop_the_services_from_importing():
    code = "import os, services; print(os.environ.get('GRPC_EXPERIMENTS'))"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | {"TANDEM_GRPC_IO": "epoll"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None"] and "TANDEM_GRPC_IO must be one of" in out.stderr
