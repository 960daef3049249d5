"""bench/host_overhead.py: the proxy's rows for verify steps and static drafts, counted, not timed."""

from __future__ import annotations

import json

from bench import host_overhead


def test_json_rows_hold_one_sync_on_the_static_paths(capsys):
    assert host_overhead.main(["--batches", "1", "--ops", "chain4,draft4,beam6", "--repeats", "1", "--steps", "1",
                               "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {(r["path"], r["op"], r["batch"]) for r in rows} == {
        (p, op, 1) for p in ("eager", "graph") for op in ("chain4", "draft4", "beam6")}  # fmt: skip
    for r in rows:
        assert set(r) >= {"path", "op", "batch", "ops_outside", "syncs", "python_calls", "ms"}
        if r["path"] == "graph":
            assert r["syncs"] == 1 and host_overhead.goals(r)["syncs"]
        else:
            assert r["syncs"] > 1  # the eager drafters and forward read the device again and again
    graph = {r["op"]: r for r in rows if r["path"] == "graph"}
    eager = {r["op"]: r for r in rows if r["path"] == "eager"}
    for op in ("draft4", "beam6"):
        assert graph[op]["ops_outside"] * 20 < eager[op]["ops_outside"]
        assert graph[op]["python_calls"] * 20 < eager[op]["python_calls"]
