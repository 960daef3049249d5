"""The `tandem` command's set-up paths, run as a user runs them (a real process): --version, a bad setting for
`tandem serve` (one line on stderr, exit 2, no traceback), and `tandem up` with the user's own target and draft."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.version import service_version
from shared.engine.errors import ModelLoadError
from shared.engine.loading import SUPPORTED_FAMILIES, load_causal_lm

ROOT = Path(__file__).resolve().parents[2]


def _tandem(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "sdk.cli", *args], cwd=ROOT, env=full_env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def test_version_prints_the_package_version():
    done = _tandem("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"tandem {service_version()}"


@pytest.mark.parametrize(
    ("role", "env", "names"),
    [
        ("target", {"TANDEM_PORT": "abc"}, "TANDEM_PORT='abc'"),
        ("draft", {"TANDEM_MODEL": "ngram:x"}, "TANDEM_MODEL='ngram:x'"),
        ("target", {"TANDEM_MODEL": "/no/such/model"}, "/no/such/model"),
        ("scheduler", {"TANDEM_SPECULATION_POLICY": "bogus"}, "unknown speculation policy 'bogus'"),
        ("scheduler", {"TANDEM_QUEUE_POLICY": "laps-sd:est=3"}, "laps-sd est"),
    ],
)
def test_serve_turns_a_bad_setting_into_one_line_and_exit_code_2(role, env, names):
    done = _tandem("serve", role, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tandem serve {role}: ") and names in lines[0], done.stderr


def test_a_model_outside_the_supported_families_is_refused_by_name(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="'gpt2' model; the engine runs the llama, qwen2, qwen3, mistral"):
        load_causal_lm(tmp_path)
    assert SUPPORTED_FAMILIES == ("llama", "qwen2", "qwen3", "mistral")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_serves_a_users_own_target_and_draft(tmp_path):
    """A Qwen2 pair the user saved: `tandem up --target-model DIR --draft-model DIR` serves it losslessly."""
    from sdk import Client
    from shared.models.tiny import save_tiny
    from tests.support.tiny_stack import Reference

    target = save_tiny(tmp_path / "my-target", "qwen2", num_layers=2, seed=0, max_position_embeddings=1024)
    draft = save_tiny(tmp_path / "my-draft", "qwen2", num_layers=1, seed=1, max_position_embeddings=1024)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | {"TANDEM_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sdk.cli", "up", "--target-model", str(target), "--draft-model", str(draft),
         "--port", str(port), "--metrics-port", "0", "--speculation-policy", "fixed:3", "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        out = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            out.append(line)
            if line.startswith("try:"):
                break
        text = "".join(out)
        assert "Tandem is up" in text, text
        assert re.search(r"draft\s+│?\s*127\.0\.0\.1:\d+", text), text
        prompt = [1, 502, 77, 9]
        with Client(f"127.0.0.1:{port}") as client:
            result = client.generate(prompt, max_new_tokens=12, speculation=3)
        assert result.token_ids == Reference(target).greedy(prompt, 12)
        assert result.stats.num_draft_tokens > 0  # the user's draft drafted
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
