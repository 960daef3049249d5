"""Ports for servers about to start: never the same one twice in a process, even from threads."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

from shared.free_ports import free_ports


def test_chosen_together_they_are_distinct_and_bindable():
    ports = free_ports("127.0.0.1", 5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when handed out


def test_never_handed_out_twice_across_threads():
    """Stacks started at once choose ports before any of their servers bind: no two may get one port."""
    with ThreadPoolExecutor(8) as pool:
        batches = list(pool.map(lambda _: free_ports("127.0.0.1", 5), range(200)))
    every = [p for batch in batches for p in batch]
    assert len(every) == len(set(every)) == 1000
