"""The launcher's split of the machine between draft and target (FASER §4.4): threads on CPU, MPS on CUDA."""

from __future__ import annotations

import asyncio

import pytest

from services.launcher import LaunchConfig, resource_env


def test_no_split_by_default():
    assert resource_env(LaunchConfig(), on_cuda=False) == {"draft": {}, "target": {}}


def test_share_splits_the_cores_on_cpu():
    env = resource_env(LaunchConfig(draft_share=0.25), on_cuda=False, cores=8)
    assert env == {"draft": {"TANDEM_THREADS": "2"}, "target": {"TANDEM_THREADS": "6"}}


def test_explicit_threads_win_over_the_share():
    env = resource_env(LaunchConfig(draft_share=0.25, target_threads=3), on_cuda=False, cores=8)
    assert env == {"draft": {"TANDEM_THREADS": "2"}, "target": {"TANDEM_THREADS": "3"}}
    env = resource_env(LaunchConfig(draft_threads=1), on_cuda=False)
    assert env == {"draft": {"TANDEM_THREADS": "1"}, "target": {}}


def test_share_on_cuda_sets_mps_percentages():
    env = resource_env(LaunchConfig(draft_share=0.3), on_cuda=True)
    assert env["draft"] == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    assert env["target"] == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}


@pytest.mark.parametrize("share", [0.0, 1.0, 1.5])
def test_share_must_leave_both_some(share):
    with pytest.raises(ValueError):
        LaunchConfig(draft_share=share)


def test_the_service_applies_its_threads(tmp_path):
    import torch

    from services.engine_host import EngineHost
    from services.settings import ServiceSettings
    from shared.models.tiny import save_tiny

    model = save_tiny(tmp_path / "draft", "llama", num_layers=1, seed=1)
    before = torch.get_num_threads()
    try:
        host = asyncio.run(EngineHost.load(ServiceSettings(model=str(model), device="cpu", threads=1), "draft"))
        host.close()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
