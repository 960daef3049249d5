"""The verify budget B and the cost model the scheduler hands its policies, read at startup.

    budget = await load_budget(settings, target_info, store)
    SchedulerConfig(token_budget=budget.token_budget)     # -> SpecContext.token_budget every step

Where they come from, first match wins (``budget.source`` says which; the
scheduler logs it)::

    B            TANDEM_TOKEN_BUDGET (settings.token_budget)          "setting"
                 else the profile's token_budget                      "file:<path>" | "redis:<blob>"
                 else None: the policies' own default                 "none"
    profile      TANDEM_PROFILE (settings.profile), a profile file
                 else <home>/profiles/<target model>/*.json, the newest measured on the
                      target's device type with its dtype
                 else the Redis blob profile:<target model> (`tandem profile --redis-url`)

A profile measured on other hardware than the target serves on is worse than
none (B of a GPU on a CPU target), so profiles whose device type or dtype
differ from the target's Info are skipped, with a log line saying so. On a CPU
a profile measured at the service's own torch thread count (Info.cpu_threads)
wins over a newer one measured at another (a FASER stack runs each model on
one of the two cores: T(1) 61 ms there against 53 ms on both); failing that,
the newest matching one serves, with a log line naming both counts.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from services.settings import ServiceSettings
from shared.profiling.cost_model import CostModel, Profile, load_profile, redis_blob_name, slug

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    token_budget: int | None  # B; None = not known (policies fall back to their default)
    cost_model: CostModel | None  # T_fwd of the target, when profiled
    source: str  # where B came from: "setting", "file:<path>", "redis:<blob>" or "none"
    profile: Profile | None = None
    profile_source: str | None = None  # where the profile came from (also when B was set explicitly)

    def describe(self) -> str:
        b = "policy default" if self.token_budget is None else str(self.token_budget)
        text = f"token budget B = {b} (source: {self.source})"
        if self.cost_model is not None:
            cm = self.cost_model
            text += (
                f"; cost model from {self.profile_source}: T_fwd = {cm.alpha_s * 1e6:.3g} us*N_context + "
                f"{cm.gamma_s * 1e3:.3g} ms*N_batched + {cm.delta_s * 1e3:.3g} ms"
                f" (+ c_t {cm.verify_s * 1e3:.3g} ms per verify)"
            )
        return text


async def load_budget(settings: ServiceSettings, target_info, store=None) -> Budget:
    """B and the cost model for the target described by ``target_info`` (a ServiceInfo); see the module docstring.

    ``store`` is an AsyncStateStore (or None: no Redis lookup). A missing or
    unreadable profile found by looking is skipped (the scheduler serves
    without one); one named by ``settings.profile`` must load, or this raises.
    """
    profile, where = await asyncio.to_thread(profile_from_files, settings, target_info)
    if profile is None and store is not None:
        profile, where = await _from_redis(store, target_info)
    if settings.token_budget is not None:
        return Budget(settings.token_budget, profile and profile.cost_model, "setting", profile, where)
    if profile is not None:
        return Budget(profile.token_budget, profile.cost_model, where, profile, where)
    return Budget(None, None, "none")


# A model-free draft (ngram, suffix: the draft service reports dtype "none") runs no forward: a speculate is a
# lookup of tens of microseconds. Its cost model says so, so that the policies planning with one (FASER's
# frontier gate, SmartSpec's and Nightjar's priors) do not assume a model's cost: with the generic prior the
# frontier gate was open and chunked free drafts into extra verify passes (bench-faser on grounded prompts).
MODEL_FREE_DRAFT = CostModel(alpha_s=0.0, gamma_s=0.0, delta_s=1e-4)


def load_draft_cost_model(settings: ServiceSettings, draft_info) -> CostModel | None:
    """T_fwd of the draft from the newest matching profile under <home>/profiles/<draft model>/, if any;
    MODEL_FREE_DRAFT for a model-free draft.

    Optional: without one the speculation-length policies measure the draft online (step_cost.py).
    """
    from shared.models.paths import Paths

    if getattr(draft_info, "dtype", None) == "none":
        log.info("model-free draft %s: cost model %s", getattr(draft_info, "model_name", "?"), MODEL_FREE_DRAFT)
        return MODEL_FREE_DRAFT

    profile, where = _newest_matching(Paths.resolve(settings.home).home / "profiles" / slug(draft_info.model_name),
                                      draft_info, "draft ")  # fmt: skip
    if profile is None:
        return None
    log.info("draft cost model from %s", where)
    return profile.cost_model


def profile_from_files(settings: ServiceSettings, target_info) -> tuple[Profile | None, str | None]:
    """The newest profile under <home>/profiles/<model>/ measured on ``target_info``'s device type and dtype
    (``settings.profile`` when set); also read by the target service for early exit's per-token cost."""
    from shared.models.paths import Paths

    if settings.profile is not None:  # named explicitly: it must be readable
        path = Path(settings.profile).expanduser()
        return load_profile(path), f"file:{path}"
    return _newest_matching(Paths.resolve(settings.home).home / "profiles" / slug(target_info.model_name), target_info)


def _newest_matching(folder: Path, info, what: str = "") -> tuple[Profile | None, str | None]:
    """The newest readable profile in ``folder`` measured on ``info``'s device type and dtype, one measured at
    ``info``'s CPU thread count first."""
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True) if folder.is_dir() else []
    found: list[tuple[Profile, str]] = []
    for path in paths:
        try:
            profile = load_profile(path)
        except (OSError, ValueError, ValidationError) as exc:
            log.warning("skipping unreadable %sprofile %s: %s", what, path, exc)
            continue
        if _matches(profile, info, f"file:{path}"):
            found.append((profile, f"file:{path}"))
    if not found:
        return None, None
    threads = int(getattr(info, "cpu_threads", 0) or 0)
    same = [(p, w) for p, w in found if not threads or _threads(p) in (None, threads)]
    if same:
        return same[0]
    profile, where = found[0]
    log.warning("no %sprofile at %d CPU threads, the service's count; using %s, measured at %s",
                what, threads, where, _threads(profile))  # fmt: skip
    return profile, where


def _threads(profile: Profile) -> int | None:
    """The torch CPU threads a profile was measured at (None: not a CPU profile, or not recorded)."""
    if profile.device.split(":")[0] != "cpu":
        return None
    value = profile.settings.get("threads")
    return int(value) if isinstance(value, int | float) else None


async def _from_redis(store, target_info) -> tuple[Profile | None, str | None]:
    name = redis_blob_name(target_info.model_name)
    try:
        blob = await store.get_json(name)
    except Exception as exc:  # noqa: BLE001 - Redis down: serve without a profile
        log.warning("could not read profile %s from Redis: %s", name, exc)
        return None, None
    if blob is None:
        return None, None
    try:
        profile = Profile.model_validate(blob)
    except ValidationError as exc:
        log.warning("skipping unreadable profile %s in Redis: %s", name, exc)
        return None, None
    where = f"redis:{name}"
    return (profile, where) if _matches(profile, target_info, where) else (None, None)


def _matches(profile: Profile, target_info, where: str) -> bool:
    """Was ``profile`` measured on the kind of device, and in the dtype, the target serves with?"""
    want_device, want_dtype = target_info.device.split(":")[0], target_info.dtype
    got_device = profile.device.split(":")[0]
    if (want_device and got_device != want_device) or (want_dtype and profile.dtype != want_dtype):
        log.info(
            "skipping profile %s: measured on %s/%s, the target serves on %s/%s",
            where, profile.device, profile.dtype, target_info.device, target_info.dtype,
        )  # fmt: skip
        return False
    return True
