"""Ask a server's grpc.health.v1 whether it is SERVING (container healthchecks, the launcher).

python -m shared.rpc.health_probe 127.0.0.1:50052 tandem.v1.TargetService   # exit 0 when SERVING
python -m shared.rpc.health_probe 127.0.0.1:50052 tandem.v1.TargetService \\
    --ca /certs/ca.crt --cert /certs/tls.crt --key /certs/tls.key --server-name target   # (mutual) TLS

status = check("127.0.0.1:50052", TARGET_SERVICE)            # "SERVING", "NOT_SERVING", "UNREACHABLE", ...
status = check("127.0.0.1:50051", TANDEM_SERVICE, tls=ClientTls(ca=Path("ca.crt")))
wait_serving("127.0.0.1:50052", TARGET_SERVICE, timeout_s=60) # True once SERVING

TLS is on with ``--tls`` (the system's CAs) or a non-empty ``--ca``; empty values count as unset, so a
compose file can pass ``--ca=${VAR:-}`` whether or not TLS is configured. When the check fails because
one side speaks TLS and the other does not (or the certificate is not trusted), that is printed on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from shared.rpc.tls import ClientTls, TlsConfigError
from shared.rpc.tls_mismatch import tls_problem


def check(address: str, service: str = "", timeout_s: float = 2.0, *, tls: ClientTls | None = None) -> str:
    """The serving status name; "UNREACHABLE" when the call fails, "UNKNOWN_SERVICE" for NOT_FOUND."""
    return probe(address, service, timeout_s, tls)[0]


def probe(address: str, service: str = "", timeout_s: float = 2.0, tls: ClientTls | None = None) -> tuple[str, str]:
    """(status name as ``check`` gives it, the failed call's details or "")."""
    if tls is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, tls.credentials(), options=list(tls.options()))
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            status = "UNKNOWN_SERVICE" if exc.code() == grpc.StatusCode.NOT_FOUND else "UNREACHABLE"
            return status, exc.details() or ""
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), ""


def wait_serving(
    address: str, service: str = "", timeout_s: float = 60.0, interval_s: float = 0.2, *, tls: ClientTls | None = None
) -> bool:
    """Poll until SERVING; False when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check(address, service, timeout_s=min(2.0, max(0.1, deadline - time.monotonic())), tls=tls) == "SERVING":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def client_tls(tls: bool, ca: str | None, cert: str | None, key: str | None, server_name: str | None) -> ClientTls | None:
    """The probe's TLS from its flags (empty = unset); None = plaintext."""
    path = lambda value: Path(value) if value else None  # noqa: E731
    if not tls and not ca:
        if cert or key:
            raise TlsConfigError("--cert/--key (mutual TLS) need TLS: give --ca or --tls")
        return None
    return ClientTls(ca=path(ca), cert=path(cert), key=path(key), server_name=server_name or None, what="probe")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.rpc.health_probe", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port")
    parser.add_argument("service", nargs="?", default="", help='service name; "" (default) is the whole server')
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds for one check")
    parser.add_argument("--wait", type=float, default=0.0, help="keep polling up to this many seconds")
    parser.add_argument("--tls", action="store_true", help="dial with TLS (trusting the system's CAs unless --ca)")
    parser.add_argument("--ca", default="", help="PEM CA bundle the server's certificate must chain to (implies --tls)")
    parser.add_argument("--cert", default="", help="client certificate, for a server that requires one (mutual TLS)")
    parser.add_argument("--key", default="", help="private key of --cert")
    parser.add_argument("--server-name", default="", help="name the server's certificate must carry (default: the host)")
    args = parser.parse_args(argv)
    try:
        tls = client_tls(args.tls, args.ca, args.cert, args.key, args.server_name)
        if args.wait > 0 and wait_serving(args.address, args.service, timeout_s=args.wait, tls=tls):
            status, details = "SERVING", ""
        else:
            status, details = probe(args.address, args.service, args.timeout, tls)
    except TlsConfigError as exc:
        print("UNREACHABLE")
        print(exc, file=sys.stderr)
        return 1
    print(status)
    if status == "UNREACHABLE":
        problem = tls_problem(args.address, tls=tls is not None, details=details)
        print(problem or details, file=sys.stderr)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
