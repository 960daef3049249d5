"""The CLI as a user runs it, against `tandem up`'s stack on the demo pair (SmolLM2-135M-Instruct + its draft).

`tandem generate` sends the README's question in the model's chat template and gets Paris (raw, the same
text gets a token or two of nonsense); `tandem chat` is driven through two turns in a real terminal (tmux):
streamed answers, a dim stats line per turn whose context grows with the conversation, Ctrl-C stopping an
answer midway, and /exit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.launcher import LaunchConfig, launch

REPO = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def demo_stack(smollm2_dir, tandem_paths, tmp_path_factory) -> Iterator[str]:
    config = LaunchConfig(pair="demo", home=tandem_paths.home, port=0, metrics_port=None, device="cpu",
                          log_dir=tmp_path_factory.mktemp("logs"), startup_timeout_s=300)  # fmt: skip
    with launch(config) as stack:
        yield stack.endpoints.scheduler


def _tandem(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sdk.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=REPO)  # fmt: skip


def test_generate_applies_the_chat_template(demo_stack):
    templated = _tandem("generate", QUESTION, "--max-new-tokens", "32", "--spec", "4", "--addr", demo_stack)
    assert templated.returncode == 0, templated.stderr
    assert "Paris" in templated.stdout
    assert re.search(r"\d+ tokens \(eos\), TTFT .* tokens/step, acceptance", templated.stderr)
    raw = _tandem("generate", QUESTION, "--max-new-tokens", "32", "--spec", "4", "--raw", "--addr", demo_stack)
    assert raw.returncode == 0 and "Paris" not in raw.stdout  # what the model makes of text without its template
    both = _tandem("generate", QUESTION, "--raw", "--system", "Be brief.", "--addr", demo_stack)
    assert both.returncode == 2 and "--system needs the chat template" in both.stderr


class Tmux:
    """One program in a detached tmux session on a private server socket."""

    def __init__(self, command: str, name: str = "chat") -> None:
        self.base = ["tmux", "-L", f"tandem-test-{os.getpid()}"]
        self.name = name
        subprocess.run([*self.base, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", command], check=True)

    def send(self, text: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, "-l", text], check=True)
        subprocess.run([*self.base, "send-keys", "-t", self.name, "Enter"], check=True)

    def key(self, name: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", self.name, name], check=True)

    def screen(self) -> str:
        out = subprocess.run([*self.base, "capture-pane", "-p", "-J", "-S", "-500", "-t", self.name],
                             capture_output=True, text=True)  # fmt: skip
        return out.stdout

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 400) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if len(re.findall(pattern, screen)) >= count:
                return screen
            time.sleep(0.5)
        raise AssertionError(f"{pattern!r} x{count} never showed; the screen:\n{self.screen()}")

    def alive(self) -> bool:
        return subprocess.run([*self.base, "has-session", "-t", self.name], capture_output=True).returncode == 0

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


@pytest.mark.timeout(900)  # two answers of a 135M model on a shared 2-core CPU
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")
def test_chat_two_turns_in_a_terminal(demo_stack):
    stats = r"turn (\d+), context (\d+) tokens: (\d+) tokens \(\w+\), TTFT [\d.]+ ms, .* tokens/step"
    # the pane's own size, not a COLUMNS this process may have inherited
    tmux = Tmux(f"cd {REPO} && env -u COLUMNS -u LINES PYTHONPATH={REPO} {sys.executable} -m sdk.cli chat "
                f"--max-new-tokens 48 --spec 3 --addr {demo_stack}")  # fmt: skip
    try:
        tmux.wait_for(r"you> ")
        tmux.send(QUESTION)
        tmux.wait_for(stats)
        tmux.send("And what is the capital of Germany?")
        screen = tmux.wait_for(stats, count=2)
        assert "Paris" in screen
        (t1, ctx1, gen1), (t2, ctx2, _) = [tuple(map(int, m)) for m in re.findall(stats, screen)]
        assert (t1, t2) == (1, 2) and ctx2 > ctx1 + gen1  # the second turn carried the first, question and answer
        tmux.wait_for(r"you> ", count=3)
        tmux.send("Tell me a long story about a robot who learns to paint.")
        tmux.wait_for(r"learns to paint\.\n\S")  # the answer has begun streaming
        tmux.key("C-c")  # stops it: the server aborts the request, the turn is dropped, the chat goes on
        screen = tmux.wait_for(r"you> ", count=4)
        assert "stopped" in screen and len(re.findall(stats, screen)) == 2
        tmux.send("/exit")
        deadline = time.monotonic() + 30
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tmux.alive()  # /exit ended the program (and with it the session)
    finally:
        tmux.close()
