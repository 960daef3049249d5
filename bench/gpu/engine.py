"""The engine on a GPU, with no weights to carry: ``python3 -m bench.gpu.engine --out DIR``.

Random-weight targets of real shapes are built on the device from a seed (SmolLM2-135M and
Llama-3.1-8B), in bfloat16 (and the 135M one in float32 too). Per shape it measures

    greedy       Tandem's static step (CUDA graphs) against HF ``generate`` on the same weights:
                 exact in float32; in bfloat16 the first divergence and the reference's top-2
                 margin there (a near-tie is bf16 noise, not a bug)
    verify       engine time per step, graph and eager side by side (interleaved, medians of
                 ``--steps``), at B = 1, 8, 32, 64 and Q = 1 (decode), 4 (a 3-token chain + bonus)
    sampled      the same for sampled requests (temperature 0.8, a 3-token chain + bonus) at B = 1, 8, 32:
                 forward, probabilities and the walk in one graph (sampled_step.py) against eager
    floor        weight bytes / the device's measured copy bandwidth: what one forward must cost
    draft        (the 135M shape, as a draft model) one speculate call of a greedy 4-token chain and of a
                 beam of depth 3 and width 2, the static drafts (one CUDA graph for all the call's
                 forwards) and the eager drafters side by side at B = 1, 8, 32, and whether both drafted
                 the same tokens (float32)

and writes ``engine.json`` to DIR. It needs torch, transformers, numpy and pydantic only
(``--wheels DIR`` installs pydantic from carried wheels first, offline).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}  # fmt: skip
BATCHES = (1, 8, 32, 64)
QS = (1, 4)
CONTEXT = 256


def build(shape: str, dtype, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(max_position_embeddings=8192, **SHAPES[shape])
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def engine_for(model, static: bool, blocks: int):
    from shared.engine.config import EngineConfig
    from shared.engine.runner import ModelRunner
    from shared.engine.target_engine import TargetEngine

    config = EngineConfig(num_blocks=blocks, block_size=16, static_step=static, attention_backend="sdpa")
    return TargetEngine(ModelRunner(model, config))  # runners may share a model: each has its own KV pool


def greedy_check(model, prompts: list[list[int]], new_tokens: int) -> dict:
    """Tandem (static step, one request at a time) vs HF generate on the same weights."""
    import copy

    import torch

    from shared.engine.types import PrefillItem, VerifyItem

    ref_cfg = copy.deepcopy(model.config)
    ref_cfg._attn_implementation = "sdpa"
    ref = type(model)(ref_cfg).to(device="cuda", dtype=next(model.parameters()).dtype).eval()
    ref.load_state_dict(model.state_dict())
    engine = engine_for(model, True, 512)
    out = []
    for i, prompt in enumerate(prompts):
        with torch.inference_mode():
            hf = ref.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=new_tokens, do_sample=False,
                              min_new_tokens=new_tokens, pad_token_id=0)[0, len(prompt):].tolist()  # fmt: skip
        first = engine.prefill([PrefillItem(f"g{i}", prompt)])[0].first_token
        got = [first]
        while len(got) < new_tokens:
            got += engine.verify([VerifyItem(f"g{i}")])[0].tokens
        engine.release([f"g{i}"])
        diverge = next((j for j, (a, b) in enumerate(zip(got, hf)) if a != b), None)
        margin = None
        if diverge is not None:
            with torch.inference_mode():
                logits = ref(torch.tensor([prompt + hf[:diverge]], device="cuda")).logits[0, -1].float()
            top = logits.topk(2).values
            margin = float(top[0] - top[1])
        out.append({"equal": diverge is None, "first_divergence": diverge, "top2_margin_there": margin})
    del ref
    return {"prompts": out, "equal": sum(o["equal"] for o in out), "of": len(out),
            "replays": engine.static.graphs.replays if engine.static and engine.static.graphs else 0}  # fmt: skip


def verify_times(model, steps: int) -> list[dict]:
    import torch

    from shared.engine.types import PrefillItem, TokenTree, VerifyItem

    vocab = model.config.vocab_size
    rows = []
    g = torch.Generator().manual_seed(1)
    for batch in BATCHES:
        engines = {p: engine_for(model, p == "graph", batch * 24 + 64) for p in ("eager", "graph")}
        prompts = torch.randint(0, vocab, (batch, CONTEXT), generator=g).tolist()
        for e in engines.values():
            e.prefill([PrefillItem(f"s{i}", p) for i, p in enumerate(prompts)])
        for q in QS:
            times = {p: [] for p in engines}
            for step in range(steps + 3):
                toks = torch.randint(0, vocab, (batch, q - 1), generator=g).tolist()
                items = [VerifyItem(f"s{i}", TokenTree(toks[i], list(range(-1, q - 2)))) for i in range(batch)]
                for p, e in engines.items():  # interleaved
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    e.verify(items)
                    torch.cuda.synchronize()
                    if step >= 3:  # the first steps capture graphs
                        times[p].append(1e3 * (time.perf_counter() - t0))
            for p, t in times.items():
                rows.append({"path": p, "batch": batch, "q": q, "ms": statistics.median(t), "min_ms": min(t),
                             "max_ms": max(t)})  # fmt: skip
        del engines
        torch.cuda.empty_cache()
    return rows


DRAFT_BATCHES = (1, 8, 32)
DRAFT_SHAPES = {"chain4": dict(chain_len=4), "beam3x2": dict(tree_depth=3, tree_width=2)}


def draft_times(model, steps: int) -> dict:
    """Draft calls through ``DraftEngine.speculate``: graph vs eager ms per call, and equal tokens."""
    import torch

    from shared.engine.config import EngineConfig
    from shared.engine.draft_engine import DraftEngine
    from shared.engine.runner import ModelRunner
    from shared.engine.types import PrefillItem, SpecItem

    vocab = model.config.vocab_size
    rows, equal, calls = [], 0, 0
    g = torch.Generator().manual_seed(3)
    for (name, spec), batch in ((d, b) for d in DRAFT_SHAPES.items() for b in DRAFT_BATCHES):
        config = lambda static: EngineConfig(num_blocks=batch * 24 + 64, block_size=16, static_step=static,  # noqa: E731
                                             attention_backend="sdpa")  # fmt: skip
        engines = {p: DraftEngine(ModelRunner(model, config(p == "graph"))) for p in ("eager", "graph")}
        prompts = torch.randint(0, vocab, (batch, CONTEXT), generator=g).tolist()
        for e in engines.values():
            e.prefill([PrefillItem(f"d{i}", p) for i, p in enumerate(prompts)])
        last = {p: [[] for _ in range(batch)] for p in engines}
        times = {p: [] for p in engines}
        for step in range(steps + 3):
            bonus = torch.randint(0, vocab, (batch,), generator=g).tolist()
            drafted = {}
            for p, e in engines.items():  # interleaved; both keep the graph path's chains (the same sequences)
                keep = last["graph"]
                items = [SpecItem(f"d{i}", keep[i][:1] + [bonus[i]], **spec) for i in range(batch)]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                drafted[p] = [t.token_ids for t in e.speculate(items)]
                torch.cuda.synchronize()
                if step >= 3:
                    times[p].append(1e3 * (time.perf_counter() - t0))
            equal += drafted["graph"] == drafted["eager"]
            calls += 1
            last = {p: drafted["graph"] for p in engines}
        for p, t in times.items():
            rows.append({"path": p, "batch": batch, "draft": name, "ms": statistics.median(t), "min_ms": min(t),
                         "max_ms": max(t)})  # fmt: skip
        pool = engines["graph"].chains.graphs if engines["graph"].chains else None
        rows[-1]["replays"] = pool.replays if pool is not None else 0  # CUDA graph replays so far (0 on CPU)
        del engines
        torch.cuda.empty_cache()
    return {"rows": rows, "calls_equal": equal, "calls": calls}


def sampled_verify_times(model, steps: int) -> list[dict]:
    """Sampled verify steps (device acceptance), graph and eager side by side: ms per step."""
    import torch

    from shared.engine.types import PrefillItem, SamplingParams, TokenTree, VerifyItem

    vocab = model.config.vocab_size
    rows = []
    g = torch.Generator().manual_seed(5)
    for batch in DRAFT_BATCHES:
        engines = {p: engine_for(model, True, batch * 24 + 64) for p in ("eager", "graph")}
        engines["eager"].static.graphs = None  # the same static body (device acceptance), run eagerly
        prompts = torch.randint(0, vocab, (batch, CONTEXT), generator=g).tolist()
        for e in engines.values():
            e.prefill([PrefillItem(f"s{i}", p, SamplingParams(temperature=0.8, seed=i)) for i, p in enumerate(prompts)])
        times = {p: [] for p in engines}
        for step in range(steps + 3):
            toks = torch.randint(0, vocab, (batch, 3), generator=g).tolist()
            items = [VerifyItem(f"s{i}", TokenTree(toks[i], [-1, 0, 1])) for i in range(batch)]
            for p, e in engines.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                e.verify(items)
                torch.cuda.synchronize()
                if step >= 3:
                    times[p].append(1e3 * (time.perf_counter() - t0))
        for p, t in times.items():
            rows.append({"path": p, "batch": batch, "q": 4, "ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)})
        del engines
        torch.cuda.empty_cache()
    return rows


def copy_bandwidth() -> float:
    """Bytes per second of a device-to-device copy (read + write counted), best of 5."""
    import torch

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y.copy_(x)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return 2 * x.numel() / best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.gpu.engine", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--wheels", type=Path, help="install pydantic from these wheels first (offline)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args(argv)
    if args.wheels:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(args.wheels),
                        "pydantic"], check=True)  # fmt: skip
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    bandwidth = copy_bandwidth()
    result["copy_bandwidth_gb_s"] = bandwidth / 1e9
    gen = torch.Generator().manual_seed(7)
    for shape in args.shapes.split(","):
        entry = {}
        if shape == "smollm2-135m":
            model = build(shape, torch.float32)
            prompts = torch.randint(0, model.config.vocab_size, (2, 24), generator=gen).tolist()
            entry["greedy_float32"] = greedy_check(model, prompts, 32)
            entry["draft_float32"] = draft_times(model, args.steps)
            for r in entry["draft_float32"]["rows"]:
                print(f"{shape:14} {r['draft']:8} {r['path']:5} B={r['batch']:<3} {r['ms']:8.2f} ms/call", flush=True)
            del model
        model = build(shape, torch.bfloat16)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        entry["weight_bytes"] = weight_bytes
        entry["floor_ms"] = 1e3 * weight_bytes / bandwidth
        prompts = torch.randint(0, model.config.vocab_size, (2, 24), generator=gen).tolist()
        entry["greedy_bfloat16"] = greedy_check(model, prompts, 32)
        entry["verify"] = verify_times(model, args.steps)
        entry["sampled_verify"] = sampled_verify_times(model, args.steps)
        for r in entry["sampled_verify"]:
            print(f"{shape:14} sampled {r['path']:5} B={r['batch']:<3} Q=4  {r['ms']:8.2f} ms/step", flush=True)
        result["shapes"][shape] = entry
        print(json.dumps({shape: {k: v for k, v in entry.items() if k not in ("verify", "sampled_verify")}}, indent=1),
              flush=True)  # fmt: skip
        for r in entry["verify"]:
            print(f"{shape:14} {r['path']:5} B={r['batch']:<3} Q={r['q']}  {r['ms']:8.2f} ms/step", flush=True)
        del model
        torch.cuda.empty_cache()
    (args.out / "engine.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
