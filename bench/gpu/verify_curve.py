"""The verify-cost curve T(N), N = 1..256 batched tokens, and its knee B (AdaServe §3), per model and backend.

    python -m bench.gpu.verify_curve --out verify_curve.json [--models demo,llama-8b] [--backends sdpa,flashinfer]

Each point is what `tandem profile` measures (shared/profiling/measure.py): real verify forwards
of 4 sequences (root + a chain each) at a 64-token context, sizes interleaved, medians of the
repeats; B comes from ``cost_model.find_budget`` (a knee where the sweep bends, else the ridge).
Models::

    demo        the demo target (SmolLM2-135M-Instruct, bf16): its profile with the backend the services
                use (flashinfer when installed) is stored under $TANDEM_HOME/profiles, as `tandem
                profile` would, so bench-slo's tree policies read the GPU's B; the demo draft is profiled
                too (SmartSpec's and FASER's draft cost)
    llama-8b    a randomly initialised Llama-3.1-8B-shaped target (hidden 4096, 32 layers, GQA 32/8,
                head dim 128, MLP 14336, vocab 128256; 8.0B parameters, 16 GB in bf16), built on the GPU:
                timing only, no weights needed
    llama-1b    Llama-3.2-1B-shaped (hidden 2048, 16 layers, GQA 32/8, head dim 64, MLP 8192; 1.2B)

Results are written after every curve, so a stage stopped at its budget keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
CONTEXT_GRID = (4, 64, 256)
LLAMA_SHAPES = {
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=64, vocab_size=128256, rope_theta=500000.0,
                     tie_word_embeddings=True),
    "llama-tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, vocab_size=1024),  # smoke runs on a CPU
}  # fmt: skip


def random_llama(shape: str, device: str = "cuda"):
    """A Llama-shaped causal LM with random weights, built directly on ``device`` in bf16 (timing only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(max_position_embeddings=4096, **LLAMA_SHAPES[shape])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().requires_grad_(False)


def curve(model, name: str, backend: str, *, repeats: int, kv_bytes: int, grid=GRID, log=print) -> tuple[dict, object]:
    """One sweep through a fresh runner with ``backend``; (row for the JSON, the Profile)."""
    from shared.engine.config import EngineConfig
    from shared.engine.runner import ModelRunner
    from shared.profiling.measure import measure

    runner = ModelRunner(model, EngineConfig(attention_backend=backend, kv_cache_bytes=kv_bytes), name=name)
    t = time.perf_counter()
    profile = measure(runner, model=name, grid=grid, context_grid=CONTEXT_GRID, num_seqs=4, short_context=64,
                      long_context=512, repeats=repeats, log=log)  # fmt: skip
    runner.check_accounting()
    knee = profile.knee
    row = {
        "model": name, "backend": runner.backend.name, "dtype": str(runner.dtype).removeprefix("torch."),
        "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3), "hardware": profile.hardware,
        "sweep": profile.sweep, "budget": knee.budget, "method": knee.method,
        "t1_ms": knee.latency_at_one_s * 1e3, "tB_ms": knee.latency_at_budget_s * 1e3,
        "slope_before_us": knee.slope_before_s * 1e6, "slope_after_us": knee.slope_after_s * 1e6,
        "cost_model": profile.cost_model.model_dump(), "seconds": round(time.perf_counter() - t, 1),
    }  # fmt: skip
    del runner
    return row, profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.verify_curve")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--models", default="demo,llama-8b")
    parser.add_argument("--backends", default="sdpa,flashinfer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--home", type=Path, default=None, help="Tandem home (default $TANDEM_HOME)")
    args = parser.parse_args(argv)
    import torch

    from shared.engine.loading import load_causal_lm
    from shared.models.paths import Paths
    from shared.models.registry import get_pair
    from shared.profiling.cost_model import save_profile

    t0 = time.monotonic()
    paths = Paths.resolve(args.home)
    backends = [b for b in args.backends.split(",") if b]
    if args.device != "cuda" or not _has_flashinfer():
        backends = [b for b in backends if b != "flashinfer"]
    out = {"stage": "verify_curve", "grid": list(GRID), "curves": [], "profiles_saved": [], "errors": []}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")

    for name in [m for m in args.models.split(",") if m]:
        if time.monotonic() - t0 > args.budget_s * 0.8:
            out["errors"].append(f"{name}: skipped, out of time")
            break
        try:
            if name == "demo":
                pair = get_pair("demo")
                loaded = load_causal_lm(paths.model_dir(pair.target.name), dtype="bfloat16", device=args.device,
                                        with_tokenizer=False)  # fmt: skip
                model, label, kv_bytes = loaded.model, loaded.name, 1 << 30
            else:
                model, label, kv_bytes = random_llama(name, args.device), f"random-{name}", 4 << 30
        except Exception as exc:  # noqa: BLE001 - recorded, the next model still runs
            out["errors"].append(f"{name}: {type(exc).__name__}: {exc}"[:1000])
            print(out["errors"][-1], flush=True)
            save()
            continue
        for backend in backends:
            try:
                row, profile = curve(model, label, backend, repeats=args.repeats, kv_bytes=kv_bytes)
                out["curves"].append(row)
                if name == "demo" and backend == backends[-1]:  # the services' backend ("auto")
                    out["profiles_saved"].append(str(save_profile(profile, paths.home)))
            except Exception as exc:  # noqa: BLE001
                out["errors"].append(f"{label}/{backend}: {type(exc).__name__}: {exc}"[:1000])
            save()
            print(json.dumps(out["curves"][-1] if out["curves"] else out["errors"][-1])[:600], flush=True)
        if name == "demo":
            _profile_draft(paths, args.device, out)
            save()
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()
    save()
    return 0 if out["curves"] else 1


def _profile_draft(paths, device: str, out: dict) -> None:
    """The demo draft's cost (`tandem profile --draft`, quick grid): SmartSpec's and FASER's T_draft."""
    from shared.engine.factory import build_target_engine
    from shared.models.registry import get_pair
    from shared.profiling.cost_model import save_profile
    from shared.profiling.measure import measure

    try:
        engine, loaded = build_target_engine(paths.model_dir(get_pair("demo").draft.name), device=device,
                                             dtype="bfloat16", with_tokenizer=False)  # fmt: skip
        profile = measure(engine.runner, model=loaded.name, grid=(1, 2, 4, 8, 16, 32), repeats=3)
        out["profiles_saved"].append(str(save_profile(profile, paths.home)))
        out["draft_profile"] = {"model": loaded.name, "sweep": profile.sweep, "budget": profile.knee.budget,
                                "cost_model": profile.cost_model.model_dump()}  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        out["errors"].append(f"draft profile: {type(exc).__name__}: {exc}"[:1000])


def _has_flashinfer() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
