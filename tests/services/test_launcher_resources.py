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

    async def threads_on_the_engine_thread() -> int:
        host = await EngineHost.load(ServiceSettings(model=str(model), device="cpu", threads=1), "draft")
        try:
            return (await host.run(torch.get_num_threads)).result
        finally:
            host.close()

    before = torch.get_num_threads()
    try:
        assert asyncio.run(threads_on_the_engine_thread()) == 1
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- draft_share="auto"


def test_auto_without_profiles_warns_and_splits_nothing(tmp_path, caplog):
    from services.launcher import resolve_share

    config = LaunchConfig(home=tmp_path, draft_share="auto")
    with caplog.at_level("WARNING", logger="services.launcher"):
        assert resolve_share(config, tmp_path / "t", str(tmp_path / "d"), on_cuda=False, cores=4) == (None, None)
    assert "no share profile" in caplog.text and "no split" in caplog.text


def test_auto_without_a_model_draft_splits_nothing(tmp_path, caplog):
    from services.launcher import resolve_share

    config = LaunchConfig(home=tmp_path, draft_share="auto")
    with caplog.at_level("WARNING", logger="services.launcher"):
        assert resolve_share(config, tmp_path / "t", "ngram:1-4", on_cuda=False) == (None, None)
        assert resolve_share(config, tmp_path / "t", None, on_cuda=False) == (None, None)


def test_auto_picks_r_from_the_stored_profiles_and_records_it(tmp_path):
    from services.launcher import _record_share, resolve_share
    from shared.profiling.sm_share import (
        DraftLatency, ShareCurve, ShareProfile, TargetLatency, choose_share, save_share_profile, share_hardware,
    )  # fmt: skip

    hardware = share_hardware(cores=4)
    linear = ShareCurve(a1=2.0, g1=1.0, a2=2.0, g2=1.0)  # twice as slow on nothing, 1 on the whole machine
    draft = DraftLatency(beta=1e-3, curve=linear)
    target = TargetLatency(lam=4e-3, c=2e-3, curve=linear)  # much more work: it should get most of the cores
    for model, role, fit in (("d", "draft", draft), ("t", "target", target)):
        save_share_profile(ShareProfile(model=model, role=role, hardware=hardware, device="cpu", dtype="float32",
                                        unit="threads", total=4, **{role: fit}), tmp_path)  # fmt: skip
    config = LaunchConfig(home=tmp_path, draft_share="auto", share_batch=2, share_chunk=3)
    share, choice = resolve_share(config, tmp_path / "models" / "t", str(tmp_path / "models" / "d"), on_cuda=False,
                                  cores=4)  # fmt: skip
    assert share == choose_share(draft, target, 2, 3, [0.25, 0.5, 0.75]) == 0.25
    assert (choice.b, choice.s_c) == (2, 3)
    env = resource_env(config.model_copy(update={"draft_share": share}), on_cuda=False, cores=4)
    assert env == {"draft": {"TANDEM_THREADS": "1"}, "target": {"TANDEM_THREADS": "3"}}

    record = _record_share(tmp_path, share, choice, env)
    import json

    assert json.loads((tmp_path / "share.json").read_text()) == record
    assert record["source"] == "auto" and record["choice"]["share"] == 0.25


def test_auto_must_be_resolved_before_the_env():
    with pytest.raises(ValueError, match="resolve"):
        resource_env(LaunchConfig(draft_share="auto"), on_cuda=False)


def test_free_ports_are_distinct():
    """The kernel may give a just-released port to the next bind: chosen together, they never repeat."""
    from services.launcher import _free_ports

    for _ in range(50):
        ports = _free_ports("127.0.0.1", 4)
        assert len(set(ports)) == 4 and all(p > 0 for p in ports)


def test_an_unknown_dtype_is_refused_before_anything_starts():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="dtype"):
        LaunchConfig(dtype="float8")
    assert LaunchConfig(dtype="bfloat16").dtype == "bfloat16"
