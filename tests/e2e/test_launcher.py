"""`tandem up`'s launcher as subprocesses: start Redis + three services, health, one generation, clean stop."""

from __future__ import annotations

from sdk import Client
from services.launcher import LaunchConfig, launch


def test_launch_generate_stop(tiny_pair, reference, tmp_path):
    target_dir, draft_dir = tiny_pair
    config = LaunchConfig(
        target_model=str(target_dir),
        draft_model=str(draft_dir),
        port=0,
        metrics_port=None,
        device="cpu",
        log_dir=tmp_path / "logs",
        startup_timeout_s=120,
    )
    with launch(config) as stack:
        processes = dict(stack.processes)
        redis = stack.redis
        with Client(stack.endpoints.scheduler, timeout=60) as client:
            assert client.health() == "SERVING"
            info = client.info()
            assert info.target.vocab_size == 512 and info.draft is not None
            result = client.generate([3, 1, 4, 1, 5], max_new_tokens=12, speculation=2)
        assert result.token_ids == reference.greedy([3, 1, 4, 1, 5], 12)
        assert result.stats.num_draft_tokens > 0
    assert all(p.returncode is not None for p in processes.values())
    assert not redis.running
    assert {p.name for p in (tmp_path / "logs").iterdir()} == {"target.log", "draft.log", "scheduler.log"}
