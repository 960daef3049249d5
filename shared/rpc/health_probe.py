"""Ask a server's grpc.health.v1 whether it is SERVING (container healthchecks, the launcher).

python -m shared.rpc.health_probe 127.0.0.1:50052 tandem.v1.TargetService   # exit 0 when SERVING

status = check("127.0.0.1:50052", TARGET_SERVICE)            # "SERVING", "NOT_SERVING", "UNREACHABLE", ...
wait_serving("127.0.0.1:50052", TARGET_SERVICE, timeout_s=60) # True once SERVING
"""

from __future__ import annotations

import argparse
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout_s: float = 2.0) -> str:
    """The serving status name; "UNREACHABLE" when the call fails, "UNKNOWN_SERVICE" for NOT_FOUND."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return "UNKNOWN_SERVICE" if exc.code() == grpc.StatusCode.NOT_FOUND else "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def wait_serving(address: str, service: str = "", timeout_s: float = 60.0, interval_s: float = 0.2) -> bool:
    """Poll until SERVING; False when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check(address, service, timeout_s=min(2.0, max(0.1, deadline - time.monotonic()))) == "SERVING":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.rpc.health_probe", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="host:port")
    parser.add_argument("service", nargs="?", default="", help='service name; "" (default) is the whole server')
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds for one check")
    parser.add_argument("--wait", type=float, default=0.0, help="keep polling up to this many seconds")
    args = parser.parse_args(argv)
    if args.wait > 0:
        ok = wait_serving(args.address, args.service, timeout_s=args.wait)
        status = "SERVING" if ok else check(args.address, args.service, args.timeout)
    else:
        status = check(args.address, args.service, args.timeout)
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
