"""The transport floor benchmark runs its echo servers in real processes and reports one row per pair."""

from __future__ import annotations

import json

import pytest

from bench import grpc_floor


@pytest.mark.timeout(120)
def test_every_server_and_client_pair_echoes_and_is_timed(capsys):
    assert grpc_floor.main(["--messages", "40", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["server"], r["client"]) for r in rows] == [(s, c) for s in grpc_floor.SERVERS for c in grpc_floor.CLIENTS]
    assert all(r["messages"] == 36 and 0 < r["median_ms"] <= r["p90_ms"] for r in rows)


def test_an_unknown_server_is_refused():
    with pytest.raises(SystemExit):
        grpc_floor.main(["--servers", "aio,zmq"])
