"""The short soak: requests under load while the draft, the target and Redis are killed
and restarted; nothing lost, greedy outputs equal the fault-free reference, everything idle after."""

from __future__ import annotations

import asyncio

from bench.soak import SoakConfig, passed, render, soak
from services.launcher import LaunchConfig, launch


def test_short_soak_with_every_fault_kind(tiny_pair, tmp_path):
    target_dir, draft_dir = tiny_pair
    config = LaunchConfig(target_model=str(target_dir), draft_model=str(draft_dir), port=0, metrics_port=None,
                          device="cpu", log_dir=tmp_path / "logs", startup_timeout_s=120,
                          speculation_policy="fixed:3")
    cfg = SoakConfig(requests=90, concurrency=8, faults_per_kind=1, unique_prompts=12, max_new_tokens=(8, 24))
    with launch(config) as stack:
        report = asyncio.run(soak(stack, cfg, log=lambda *_: None))
    text = render({"command": "test", "machine": "test", "date": "now"}, report)
    assert report["requests"] == 90 and report["greedy"] > 10, text
    assert report["faults"] == {"draft": 1, "target": 1, "redis": 1}, text
    assert report["lost"] == 0, text
    assert report["wrong_greedy"] == 0, text
    assert report["idle_at_end"]["idle"], text
    assert passed(report), text
