"""The README.md every results folder gets is generated from its results.json."""

from __future__ import annotations

import json

from bench import results_readme


def test_readme_is_rendered_from_the_results(tmp_path):
    summary = {"num_requests": 2, "num_ok": 2, "throughput_tok_s": 12.5, "latency_s": {"mean": 1.5, "p99": 2.0},
               "ttft_s": {"mean": 0.1}, "tpot_s": {"mean": 0.03}, "attainment": 1.0, "mean_accepted_length": 2.25}
    results = {"name": "x", "command": "python -m bench.harness --name x", "started_unix": 86400, "duration_s": 5,
               "machine": {"platform": "linux", "cpu_count": 2, "torch": "2.13", "cpu_model": "Xeon X"}, "models": {"target": "t", "draft": "d"},
               "batch1": {"target-only": {"summary": summary}}, "sweep": {"rate=1": {"tandem-k2": {"summary": summary}}},
               "plots": ["load_sweep.png"]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    text = results_readme.write(tmp_path).read_text()
    assert "`python -m bench.harness --name x`" in text and "1970-01-02" in text
    assert "Machine: linux, 2, 2.13 (CPUs, torch); Xeon X" in text
    assert "| target-only | 2/2 | 12.5 | 1.50 | 2.00 | 100 | 30.0 | 1.00 | 2.25 |" in text
    assert "## Open loop (Poisson): rate=1" in text and "![load_sweep.png](load_sweep.png)" in text
