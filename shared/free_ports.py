"""Free TCP ports for servers this process is about to start, never the same one twice.

A port probed free is not bound until the server that is given it starts listening,
seconds later for a model service. Two launches running at once in one process (the
benchmark harness starts its stacks from threads) could otherwise be handed the same
port in that window, and one of the servers would fail to bind. So every port handed out
here is remembered for the life of the process and skipped afterwards.
"""

from __future__ import annotations

import socket
import threading

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_ports(host: str, count: int) -> list[int]:
    """``count`` distinct ports free on ``host`` now and not handed out before by this process.

    Every probing socket stays bound until all are chosen, since the kernel may hand a port
    that was just released to the next bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _lock:
        chosen: list[int] = []
        socks: list[socket.socket] = []
        try:
            while len(chosen) < count:
                sock = socket.socket(family, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind((host, 0))
                port = sock.getsockname()[1]
                if port not in _handed_out:
                    chosen.append(port)
        finally:
            for sock in socks:
                sock.close()
        _handed_out.update(chosen)
        return chosen
