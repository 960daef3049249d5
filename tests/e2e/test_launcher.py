"""`tandem up`'s launcher as subprocesses: start Redis + three services, health, generations over gRPC and HTTP,
the draft's share of the cores, clean stop; the n-gram draft; a malformed draft refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk import Client
from services.launcher import LaunchConfig, LaunchError, launch


def _save_share_profiles(home: Path, tiny_pair: tuple[Path, Path], cores: int) -> None:
    """Stored share profiles of both tiny models, what `tandem profile --shares` writes."""
    from shared.profiling.sm_share import (
        DraftLatency,
        ShareProfile,
        TargetLatency,
        save_share_profile,
        share_hardware,
    )

    target_dir, draft_dir = tiny_pair
    fits = {"draft": DraftLatency(beta=1e-3), "target": TargetLatency(lam=1e-3)}
    for path, role in ((draft_dir, "draft"), (target_dir, "target")):
        profile = ShareProfile(model=path.name, role=role, hardware=share_hardware(cores=cores), device="cpu",
                               dtype="float32", unit="threads", total=cores, **{role: fits[role]})  # fmt: skip
        save_share_profile(profile, home)


def test_launch_generate_stop(tiny_pair, reference, tmp_path):
    """One launch for three setups (each launch costs two torch imports and model loads): a generation over gRPC;
    `tandem up --http-port 0`, the OpenAI-compatible API too (token-id prompts here); `tandem up --draft-share
    auto`, r from both models' stored share profiles, threads set, share.json written (with two cores or more)."""
    import json

    import httpx

    from shared.profiling.sm_share import available_cores

    target_dir, draft_dir = tiny_pair
    cores = available_cores()
    split = cores >= 2  # one core: nothing to split
    home = tmp_path / "home"
    if split:
        _save_share_profiles(home, tiny_pair, cores)
    config = LaunchConfig(
        target_model=str(target_dir),
        draft_model=str(draft_dir),
        home=home,
        draft_share="auto" if split else None,
        port=0,
        metrics_port=None,
        http_port=0,
        device="cpu",
        log_dir=tmp_path / "logs",
        startup_timeout_s=120,
    )
    with launch(config) as stack:
        processes = dict(stack.processes)
        redis = stack.redis
        share = stack.share
        with Client(stack.endpoints.scheduler, timeout=60) as client:
            assert client.health() == "SERVING"
            info = client.info()
            assert info.target.vocab_size == 512 and info.draft is not None
            result = client.generate([3, 1, 4, 1, 5], max_new_tokens=12, speculation=2)
            sampled = client.generate([3, 1, 4, 1, 5], max_new_tokens=12, speculation=2, temperature=0.8, seed=1)
        assert result.token_ids == reference.greedy([3, 1, 4, 1, 5], 12)
        assert result.stats.num_draft_tokens > 0 and sampled.stats.num_draft_tokens > 0
        url = stack.endpoints.http_url
        assert httpx.get(url + "/health").json() == {"status": "SERVING"}
        r = httpx.post(url + "/v1/completions", json={"prompt": [3, 1, 4, 1, 5], "max_tokens": 12, "temperature": 0,
                                                      "speculation": 2}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 12 and r.json()["usage"]["tandem"]["num_draft_tokens"] > 0
        maps = Path(f"/proc/{processes['scheduler'].pid}/maps")
        if maps.exists():  # Linux: the scheduler relays the draft's distributions without loading torch
            assert "libtorch" not in maps.read_text()
            assert "libtorch" in Path(f"/proc/{processes['target'].pid}/maps").read_text()
    assert all(p.returncode is not None for p in processes.values())
    assert not redis.running
    logs = tmp_path / "logs"
    assert {p.name for p in logs.iterdir()} - {"share.json"} == {"target.log", "draft.log", "scheduler.log"}
    if split:
        assert share is not None and share["source"] == "auto" and 0 < share["draft_share"] < 1
        assert json.loads((logs / "share.json").read_text()) == share
        threads = int(share["env"]["draft"]["TANDEM_THREADS"])
        assert f"torch uses {threads} threads" in (logs / "draft.log").read_text()


def test_launch_with_ngram_draft(tiny_pair, reference, tmp_path):
    """`tandem up --draft-model ngram:1-3`: no draft model to find or prepare; told the target's vocabulary."""
    target_dir, _ = tiny_pair
    config = LaunchConfig(
        target_model=str(target_dir),
        draft_model="ngram:1-3",
        port=0,
        metrics_port=None,
        device="cpu",
        log_dir=tmp_path / "logs",
        startup_timeout_s=120,
    )
    prompt = [7, 8, 9] * 3
    with launch(config) as stack, Client(stack.endpoints.scheduler, timeout=60) as client:
        assert stack.endpoints.draft is not None
        draft = client.info().draft
        assert (draft.model_name, draft.vocab_size, draft.kv_blocks_total) == ("ngram:1-3", 512, 0)
        result = client.generate(prompt, max_new_tokens=24, speculation=3)
    assert result.token_ids == reference.greedy(prompt, 24)
    assert result.stats.num_accepted_tokens > 0


def test_malformed_ngram_draft_fails_the_launch_before_anything_starts(tiny_pair, tmp_path):
    config = LaunchConfig(target_model=str(tiny_pair[0]), draft_model="ngram:4-2", log_dir=tmp_path / "logs")
    with pytest.raises(LaunchError, match="malformed n-gram draft 'ngram:4-2'"):
        with launch(config):
            pass
    assert not list((tmp_path / "logs").glob("*.log"))
