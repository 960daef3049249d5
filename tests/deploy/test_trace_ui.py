"""`make trace-ui`: one pinned Phoenix version, and its OTLP/gRPC receiver moved off every interface.

deploy/trace_ui.py runs in Phoenix's own venv; its helpers import nothing but the standard library, so
they are tested here without Phoenix."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _trace_ui():
    spec = importlib.util.spec_from_file_location("trace_ui", REPO / "deploy" / "trace_ui.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_phoenix_is_pinned_once_for_the_makefile_and_the_extra():
    makefile = (REPO / "Makefile").read_text()
    (version,) = re.findall(r"^PHOENIX_VERSION := (\S+)$", makefile, re.MULTILINE)
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert "pip install -q 'arize-phoenix==$(PHOENIX_VERSION)'" in makefile
    assert re.search(r"^TRACE_UI_HOST \?= 127\.0\.0\.1$", makefile, re.MULTILINE)
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["trace-ui"]
    assert extra == [f"arize-phoenix=={version}"]


def test_the_grpc_receiver_listens_where_the_ui_does():
    trace_ui = _trace_ui()
    assert trace_ui._on("[::]:4317", "127.0.0.1") == "127.0.0.1:4317"
    assert trace_ui._on("[::]:4317", "::1") == "[::1]:4317"
    assert trace_ui._on("[::]:4317", "0.0.0.0") == "0.0.0.0:4317"  # asked for: every interface
    assert trace_ui._url_host("0.0.0.0") == "127.0.0.1" and trace_ui._url_host("::1") == "[::1]"
    assert trace_ui.DEFAULT_HOST == "127.0.0.1"
    assert trace_ui.LOCAL_DEFAULTS["PHOENIX_DISABLE_AGENT_ASSISTANT"] == "true"
