"""`make trace-ui`: Arize Phoenix on loopback, with Tandem's project ready and its URL printed.

    .venv-trace-ui/bin/python deploy/trace_ui.py          (what the Makefile runs; Phoenix's own venv)

    Phoenix 20.26.1 on 127.0.0.1 only: UI http://127.0.0.1:6006, OTLP/gRPC 127.0.0.1:4317
    Tandem's traces: http://127.0.0.1:6006/projects/UHJvamVjdDoy
    run Tandem with TANDEM_TRACE_EXPORTER=otlp (endpoint http://127.0.0.1:4317)

Phoenix binds its UI to PHOENIX_HOST (default 0.0.0.0) but its OTLP/gRPC receiver to every
interface ([::]), whatever PHOENIX_HOST says. Here both listen on PHOENIX_HOST, 127.0.0.1 unless
set, so nothing but this machine can read or write the traces. Tandem's services name their project
in a resource attribute (openinference.project.name = tandem, shared/telemetry.py); the project is
created at startup (Phoenix's REST API) so its URL is known, and valid, before the first span.

Runs with Phoenix's venv alone (stdlib + Phoenix), never Tandem's. Environment: PHOENIX_HOST,
PHOENIX_PORT (6006), PHOENIX_GRPC_PORT (4317), PHOENIX_WORKING_DIR (its database; ~/.phoenix),
TANDEM_TRACE_PROJECT (tandem); LOCAL_DEFAULTS below switch off what a local trace viewer does not need.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

DEFAULT_HOST = "127.0.0.1"
# A trace viewer, nothing more (each may be set otherwise in the environment): no usage pings, no LLM
# assistant (it would run shell commands on this machine), no MCP server, no SQL echo of the schema migrations.
LOCAL_DEFAULTS = {"PHOENIX_TELEMETRY_ENABLED": "false", "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
                  "PHOENIX_AGENTS_DISABLE_BASH": "true", "PHOENIX_ENABLE_MCP_SERVER": "false",
                  "PHOENIX_LOG_MIGRATIONS": "false"}  # fmt: skip


def _bind_grpc_to(host: str) -> None:
    """Make every grpc.aio server of this process (Phoenix's OTLP receiver) listen on ``host`` instead of [::]."""
    import grpc.aio

    make = grpc.aio.server

    def server(*args, **kwargs):
        s = make(*args, **kwargs)
        insecure, secure = s.add_insecure_port, s.add_secure_port
        s.add_insecure_port = lambda address: insecure(_on(address, host))
        s.add_secure_port = lambda address, credentials: secure(_on(address, host), credentials)
        return s

    grpc.aio.server = server


def _on(address: str, host: str) -> str:
    port = address.rpartition(":")[2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"  # where this machine reaches a server on every interface
    return f"[{host}]" if ":" in host else host


def project_url(base: str, name: str, timeout_s: float = 300.0) -> str:
    """The UI address of project ``name``, created if missing; waits for Phoenix to answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base}/v1/projects/{name}", timeout=5) as reply:
                return f"{base}/projects/{json.load(reply)['data']['id']}"
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
            body = json.dumps({"name": name, "description": "Tandem: one trace per request"}).encode()
            post = urllib.request.Request(f"{base}/v1/projects", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(post, timeout=5) as reply:
                return f"{base}/projects/{json.load(reply)['data']['id']}"
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _announce(base: str, grpc_address: str, project: str) -> None:
    try:
        url = project_url(base, project)
    except Exception as exc:  # noqa: BLE001 - the UI still runs; say what is missing
        print(f"could not create Phoenix project {project!r}: {exc}", flush=True)
        return
    print(f"\nTandem's traces: {url}\nrun Tandem with TANDEM_TRACE_EXPORTER=otlp "
          f"(endpoint http://{grpc_address})\n", flush=True)  # fmt: skip


def main() -> None:
    host = os.environ.setdefault("PHOENIX_HOST", DEFAULT_HOST)
    for name, value in LOCAL_DEFAULTS.items():
        os.environ.setdefault(name, value)
    port, grpc_port = os.environ.get("PHOENIX_PORT", "6006"), os.environ.get("PHOENIX_GRPC_PORT", "4317")
    project = os.environ.get("TANDEM_TRACE_PROJECT", "tandem")
    _bind_grpc_to(host)
    from importlib.metadata import version

    from phoenix.server.main import main as phoenix_main

    base, grpc_address = f"http://{_url_host(host)}:{port}", f"{_url_host(host)}:{grpc_port}"
    where = f"on {host} only" if host not in ("0.0.0.0", "::") else "on every interface"
    print(f"Phoenix {version('arize-phoenix')} {where}: UI {base}, OTLP/gRPC {grpc_address}", flush=True)
    threading.Thread(target=_announce, args=(base, grpc_address, project), daemon=True).start()
    sys.argv = ["phoenix", "serve"]
    phoenix_main()


if __name__ == "__main__":
    main()
