"""`tandem profile`: measure the target's verify cost, find the budget B, store the profile.

    tandem profile                        the demo pair's target on this machine -> <home>/profiles/...
    tandem profile --pair tiny --quick    a fast smoke run
    tandem profile --if-missing           only when this model has no profile for this hardware yet
    tandem profile --model PATH --redis-url redis://...   also publish it to Redis (blob profile:<model>)
    tandem profile --shares               draft and target latency at several shares of the machine (FASER §4.4)
                                          -> <home>/profiles/<model>/shares/<hardware>.json, one per model

The scheduler reads the verify profile back (``services.scheduler.budget``)
unless TANDEM_TOKEN_BUDGET overrides B; the launcher reads the share profiles
when ``draft_share`` is ``auto`` (``sm_share.auto_share``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

QUICK_GRID = (1, 4, 8, 16, 32)  # --quick: one repeat of a coarse grid
QUICK_SHARES = {"batches": (1, 4), "tokens": (1, 3), "context": 16, "repeats": 1, "percentages": (25, 50, 100)}


def profile(
    pair: Annotated[str, typer.Option(help="Model pair whose target is profiled.")] = "demo",
    model: Annotated[str | None, typer.Option(help="A model directory or name instead of the pair's target.")] = None,
    home: Annotated[Path | None, typer.Option(help="Tandem home (default $TANDEM_HOME or ~/.cache/tandem).")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N.")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16.")] = "auto",
    threads: Annotated[
        int | None,
        typer.Option(help="torch CPU threads (default: torch's choice); --shares: the cores to split (default: all)."),
    ] = None,
    repeats: Annotated[int, typer.Option(min=1, help="Repeats per size (medians are used).")] = 3,
    quick: Annotated[bool, typer.Option(help="Small grid, one repeat: a smoke run, not a measurement.")] = False,
    redis_url: Annotated[str | None, typer.Option(help="Also store the profile in this Redis.")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the profile JSON here.")] = None,
    draft: Annotated[
        bool,
        typer.Option(
            "--draft",
            help="Profile the pair's draft instead of its target (SmartSpec's and the remaining-time model's T_draft).",
        ),
    ] = False,
    if_missing: Annotated[
        bool, typer.Option("--if-missing", help="Do nothing when this model already has a profile for this hardware.")
    ] = False,
    shares: Annotated[
        bool,
        typer.Option(
            "--shares",
            help="Profile the pair's draft and target at several shares of the machine (CPU threads, CUDA MPS) "
            "and fit FASER eq. 11-12, for `tandem up --draft-share auto`.",
        ),
    ] = False,
) -> None:
    """Measure verify latency vs batched tokens and context; store budget B and the cost model."""
    if shares:
        if model is not None or redis_url is not None or out is not None:
            Console().print("[red]--shares profiles a pair (--pair); --model, --redis-url and --out do not apply[/]")
            raise typer.Exit(2)
        profile_shares_command(pair, home, device, dtype, threads, repeats, quick, if_missing)
        return
    import torch

    from services.settings import ServiceSettings
    from shared.engine.factory import build_target_engine
    from shared.models.paths import Paths
    from shared.engine.eagle.loading import is_eagle_dir
    from shared.engine.errors import ModelLoadError
    from shared.profiling.cost_model import dtype_variant, profile_path, redis_blob_name, save_profile
    from shared.profiling.measure import hardware_name, measure

    console = Console()
    if threads:
        torch.set_num_threads(threads)
    settings = ServiceSettings(pair=pair, model=model, home=home)
    try:
        path = settings.model_path("draft" if draft and model is None else "target")
    except ModelLoadError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    if is_eagle_dir(path):  # a feature draft's forward needs the target's features: no standalone profile
        console.print(f"{path.name} is a feature-level draft (EAGLE head over the target's features); it is not "
                      "profiled alone: the speculation policies fit its cost online from the speculate times "
                      "(scheduler/policies/step_cost.py)")  # fmt: skip
        raise typer.Exit(0 if if_missing else 1)
    engine, loaded = build_target_engine(path, device=device, dtype=dtype, with_tokenizer=False)
    stored_home = Paths.resolve(home).home
    runner = engine.runner
    existing = profile_path(stored_home, loaded.name, hardware_name(runner.device),
                            dtype_variant(str(runner.device), str(runner.dtype).removeprefix("torch.")))  # fmt: skip
    if if_missing and existing.is_file():
        console.print(f"{loaded.name} is already profiled on this hardware: {existing}")
        return
    console.print(f"profiling {loaded.name} on {engine.runner.device} ...")
    kwargs = {"repeats": repeats}
    if quick:
        kwargs |= {"grid": QUICK_GRID, "context_grid": (4,), "long_context": 128, "repeats": 1}
    result = measure(engine.runner, model=loaded.name, log=console.print, **kwargs)
    stored = save_profile(result, stored_home)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(result.model_dump_json(indent=2) + "\n")
    if redis_url:
        from shared.state.store import StateStore, StoreConfig

        with StateStore(StoreConfig(url=redis_url)) as store:
            store.put_json(redis_blob_name(result.model), json.loads(result.model_dump_json()))
    cm, knee = result.cost_model, result.knee
    console.print(
        f"[bold]B = {result.token_budget}[/] tokens ({knee.method}; T(1) = {knee.latency_at_one_s * 1e3:.1f} ms, "
        f"T(B) = {knee.latency_at_budget_s * 1e3:.1f} ms) on {result.hardware}\n"
        f"T_fwd = {cm.alpha_s * 1e6:.3f} us * N_context + {cm.gamma_s * 1e3:.3f} ms * N_batched + "
        f"{cm.delta_s * 1e3:.2f} ms (+ {cm.verify_s * 1e3:.2f} ms when verifying drafted tokens)  "
        f"(R^2 {cm.r2 if cm.r2 is None else round(cm.r2, 3)})\n"
        f"stored at {stored} ({result.settings['seconds']} s)"
    )


def profile_shares_command(
    pair: str, home: Path | None, device: str, dtype: str, cores: int | None, repeats: int, quick: bool,
    if_missing: bool,
) -> None:
    """`tandem profile --shares`: both models of ``pair``, one worker process per share (measure_shares.py)."""
    import torch

    from services.settings import ServiceSettings
    from shared.engine.eagle.loading import is_eagle_dir
    from shared.engine.errors import ModelLoadError
    from shared.models.paths import Paths
    from shared.profiling.measure_shares import profile_shares
    from shared.profiling.sm_share import available_cores, model_name, save_share_profile, share_hardware, share_profile_path

    console = Console()
    settings = ServiceSettings(pair=pair, home=home)
    try:
        models = {role: settings.model_path(role) for role in ("draft", "target")}
    except ModelLoadError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    stored_home = Paths.resolve(home).home
    cores = None if device.startswith("cuda") else (cores or available_cores())
    if if_missing and cores is not None:  # on CUDA the hardware name is known only after a worker ran
        hardware = share_hardware(cores=cores)
        existing = [share_profile_path(stored_home, model_name(p), hardware) for p in models.values()]
        if all(p.is_file() for p in existing):
            console.print(f"{pair} is already share-profiled on this hardware: {', '.join(map(str, existing))}")
            return
    console.print(f"profiling {pair}'s draft and target at several shares of {device} ...")
    kwargs = {"repeats": repeats} | (QUICK_SHARES if quick else {})
    profiles = profile_shares(models, device=device, dtype=dtype, cores=cores, log=console.print, **kwargs)
    for role, prof in profiles.items():
        path = save_share_profile(prof, stored_home)
        fit = prof.draft if role == "draft" else prof.target
        curve = fit.curve
        console.print(
            f"[bold]{role}[/] {prof.model}: {fit.model_dump(exclude={'curve'})}, share factor "
            f"{curve.a1:.3g} - {curve.g1:.3g}*x up to x = {curve.knee:.2f}"
            + (f", {curve.a2:.3g} - {curve.g2:.3g}*x after" if curve.knee < 1.0 else "")
            + f" (R^2 {prof.r2 if prof.r2 is None else round(prof.r2, 3)})\n  stored at {path}"
        )
    console.print(f"{profiles['target'].settings['seconds']} s on {profiles['target'].hardware}")
