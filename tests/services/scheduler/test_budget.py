"""Where the scheduler's token budget B comes from: setting, profile file, Redis blob, or nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import fakeredis
import pytest

from services.scheduler.budget import load_budget
from services.settings import ServiceSettings
from shared.profiling.cost_model import CostModel, Knee, Profile, redis_blob_name, save_profile
from shared.state.store import AsyncStateStore, StoreConfig

TARGET = SimpleNamespace(model_name="tiny-target", device="cpu", dtype="float32")


def _profile(budget: int, *, device: str = "cpu", dtype: str = "float32", hardware: str = "cpu test") -> Profile:
    knee = Knee(budget=budget, method="ridge", slope_before_s=1e-3, slope_after_s=1e-3,
                latency_at_budget_s=0.05, latency_at_one_s=0.026)  # fmt: skip
    return Profile(model="tiny-target", hardware=hardware, device=device, dtype=dtype, token_budget=budget,
                   knee=knee, cost_model=CostModel(alpha_s=1e-6, gamma_s=1e-3, delta_s=0.025),
                   sweep=[(1, 0.026), (budget, 0.05)])  # fmt: skip


def _load(settings: ServiceSettings, store=None, target=TARGET):
    return asyncio.run(load_budget(settings, target, store))


def _store(blob: dict | None = None) -> AsyncStateStore:
    store = AsyncStateStore(StoreConfig(), client=fakeredis.FakeAsyncRedis())
    if blob is not None:
        asyncio.run(store.put_json(redis_blob_name("tiny-target"), blob))
    return store


def test_no_profile_anywhere_leaves_the_policies_default(tmp_path):
    budget = _load(ServiceSettings(home=tmp_path), _store())
    assert budget.token_budget is None and budget.cost_model is None and budget.source == "none"
    assert "policy default" in budget.describe()


def test_profile_under_home_for_the_target_model(tmp_path, caplog):
    path = save_profile(_profile(24), tmp_path)
    budget = _load(ServiceSettings(home=tmp_path))
    assert budget.token_budget == 24 and budget.source == f"file:{path}"
    assert budget.cost_model.gamma_s == pytest.approx(1e-3)
    assert "B = 24" in budget.describe() and "T_fwd" in budget.describe()


def test_setting_overrides_b_but_keeps_the_profiled_cost_model(tmp_path):
    path = save_profile(_profile(24), tmp_path)
    budget = _load(ServiceSettings.from_env(env={"TANDEM_TOKEN_BUDGET": "10"}, home=tmp_path))
    assert budget.token_budget == 10 and budget.source == "setting"
    assert budget.cost_model is not None and budget.profile_source == f"file:{path}"
    assert _load(ServiceSettings(home=tmp_path / "empty", token_budget=7)).token_budget == 7


def test_profile_of_other_hardware_is_skipped(tmp_path, caplog):
    save_profile(_profile(128, device="cuda:0", dtype="bfloat16", hardware="NVIDIA H100"), tmp_path)
    with caplog.at_level(logging.INFO, logger="services.scheduler.budget"):
        budget = _load(ServiceSettings(home=tmp_path))
    assert budget.source == "none"
    assert "measured on cuda:0/bfloat16" in caplog.text
    gpu = SimpleNamespace(model_name="tiny-target", device="cuda:1", dtype="bfloat16")
    assert _load(ServiceSettings(home=tmp_path), target=gpu).token_budget == 128  # any GPU index will do


def test_newest_matching_file_wins_and_unreadable_ones_are_skipped(tmp_path):
    import os

    old = save_profile(_profile(16, hardware="cpu old"), tmp_path)
    new = save_profile(_profile(20, hardware="cpu new"), tmp_path)
    os.utime(old, (1, 1))
    (new.parent / "zz-broken.json").write_text("{not json")
    assert _load(ServiceSettings(home=tmp_path)).token_budget == 20


def test_explicit_profile_file(tmp_path):
    path = save_profile(_profile(12), tmp_path / "elsewhere")
    budget = _load(ServiceSettings(home=tmp_path, profile=path))
    assert budget.token_budget == 12 and budget.source == f"file:{path}"
    with pytest.raises(FileNotFoundError):
        _load(ServiceSettings(home=tmp_path, profile=tmp_path / "missing.json"))


def test_redis_blob_when_no_file(tmp_path):
    store = _store(_profile(40).model_dump(mode="json"))
    budget = _load(ServiceSettings(home=tmp_path), store)
    assert budget.token_budget == 40 and budget.source == "redis:profile:tiny-target"
    save_profile(_profile(24), tmp_path)
    assert _load(ServiceSettings(home=tmp_path), store).token_budget == 24  # a file on this machine comes first


def test_redis_down_or_garbage_means_no_profile(tmp_path):
    class Down:
        async def get_json(self, name):
            raise ConnectionError("redis is down")

    assert _load(ServiceSettings(home=tmp_path), Down()).source == "none"
    assert _load(ServiceSettings(home=tmp_path), _store({"token_budget": "many"})).source == "none"


def test_the_target_prices_early_exit_at_its_profiled_per_token_cost(tmp_path):
    """The target service hands early exit its profile's gamma (FASER eq. 9's marginal cost), when there is one
    for its device type and dtype; without one (or early exit off) the settings pass through unchanged."""
    from services.engine_host import EngineHost

    engine = SimpleNamespace(runner=SimpleNamespace(device="cpu", dtype="torch.float32"))
    loaded = SimpleNamespace(name="tiny-target")
    on = ServiceSettings(home=tmp_path, early_exit="on")
    assert EngineHost._early_exit_with_profile(on, engine, loaded).token_cost_s is None  # nothing profiled yet
    save_profile(_profile(24), tmp_path)
    assert EngineHost._early_exit_with_profile(on, engine, loaded).token_cost_s == pytest.approx(1e-3)
    gpu = SimpleNamespace(runner=SimpleNamespace(device="cuda:0", dtype="torch.bfloat16"))
    assert EngineHost._early_exit_with_profile(on, gpu, loaded).token_cost_s is None  # a CPU profile: not for a GPU
    fixed = ServiceSettings(home=tmp_path, early_exit="on:token_cost_s=0.002")
    assert EngineHost._early_exit_with_profile(fixed, engine, loaded).token_cost_s == pytest.approx(2e-3)
    assert EngineHost._early_exit_with_profile(ServiceSettings(home=tmp_path), engine, loaded) is None


def test_a_profile_at_the_services_thread_count_wins_over_a_newer_one(tmp_path, caplog):
    """A FASER stack runs each model on one of two cores; the 2-thread profile prices its forwards wrong."""
    one = _profile(32, hardware="cpu test (1 threads)").model_copy(update={"settings": {"threads": 1}})
    two = _profile(64, hardware="cpu test (2 threads)").model_copy(update={"settings": {"threads": 2}})
    save_profile(one, tmp_path)
    time.sleep(0.02)
    save_profile(two, tmp_path)  # the newest
    on_one = SimpleNamespace(model_name="tiny-target", device="cpu", dtype="float32", cpu_threads=1)
    assert _load(ServiceSettings(home=tmp_path), target=on_one).token_budget == 32
    assert _load(ServiceSettings(home=tmp_path), target=TARGET).token_budget == 64  # count unknown: the newest
    on_four = SimpleNamespace(model_name="tiny-target", device="cpu", dtype="float32", cpu_threads=4)
    with caplog.at_level(logging.WARNING):
        assert _load(ServiceSettings(home=tmp_path), target=on_four).token_budget == 64
    assert "no profile at 4 CPU threads" in caplog.text
