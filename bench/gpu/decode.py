"""Plain greedy decode throughput on the GPU: Tandem's target engine vs HF ``generate``, batch 1 / 16 / 64.

    python -m bench.gpu.decode --out decode.json [--batches 1,16,64] [--backends sdpa,flashinfer]

bench/engine_bench.py's comparison, on CUDA in bf16 with the demo target: Tandem decodes the batch
in one forward per token (prefill, then empty-tree verifies) with each attention backend, HF
``generate`` decodes the same prompts left-padded with its KV cache, both exactly ``new_tokens``
per request. Configurations interleaved per repeat, medians reported; the first 8 tokens of each
request are compared as a sanity check. Results are written after every batch size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def timed(fn, device) -> tuple[float, object]:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.decode")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=120.0)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--backends", default="sdpa,flashinfer")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--home", type=Path, default=None)
    args = parser.parse_args(argv)

    from bench.gpu.greedy import chat_prompts, hf_generate, tandem_decode, target_engine
    from bench.gpu.verify_curve import _has_flashinfer
    from shared.engine.loading import load_causal_lm
    from shared.models.paths import Paths
    from shared.models.registry import get_pair

    t0 = time.monotonic()
    target_dir = Paths.resolve(args.home).model_dir(get_pair("demo").target.name)
    tandem = load_causal_lm(target_dir, dtype=args.dtype, device=args.device)
    hf = load_causal_lm(target_dir, dtype=args.dtype, device=args.device)
    device = tandem.device
    backends = [b for b in args.backends.split(",") if b and (b != "flashinfer" or (device.type == "cuda"
                                                                                    and _has_flashinfer()))]  # fmt: skip
    engines = {b: target_engine(tandem.model, b, num_blocks=4096) for b in backends}
    pad = hf.tokenizer.pad_token_id if hf.tokenizer.pad_token_id is not None else 0
    batches = [int(b) for b in args.batches.split(",") if b]
    prompts = chat_prompts(hf.tokenizer, max(batches))
    out = {"stage": "decode", "model": tandem.name, "dtype": args.dtype, "device": str(device),
           "new_tokens": args.new_tokens, "repeats": args.repeats, "rows": [], "errors": []}  # fmt: skip

    for b, engine in engines.items():  # warm-up: kernels, allocator, JIT-loaded modules
        tandem_decode(engine, prompts[:2], 4, f"warm-{b}")
    hf_generate(hf.model, prompts[:2], 4, pad)

    for batch in batches:
        left = args.budget_s - (time.monotonic() - t0)
        repeats = args.repeats if left > 60 else 1
        if left < 10:
            out["errors"].append(f"batch {batch}: skipped, out of time")
            break
        times = {b: [] for b in engines} | {"hf": []}
        outs = {}
        for r in range(repeats):
            for b, engine in engines.items():
                s, outs[b] = timed(lambda: tandem_decode(engine, prompts[:batch], args.new_tokens, f"{b}-{batch}-{r}"),
                                   device)  # fmt: skip
                times[b].append(s)
            s, outs["hf"] = timed(lambda: hf_generate(hf.model, prompts[:batch], args.new_tokens, pad), device)
            times["hf"].append(s)
        n = batch * args.new_tokens
        hf_tok_s = n / statistics.median(times["hf"])
        for b in engines:
            agree = sum(x[:8] == y[:8] for x, y in zip(outs[b], outs["hf"]))
            tok_s = n / statistics.median(times[b])
            out["rows"].append({"backend": b, "batch": batch, "tandem_tok_s": tok_s, "hf_tok_s": hf_tok_s,
                                "ratio": tok_s / hf_tok_s, "tandem_s": times[b], "hf_s": times["hf"],
                                "first8_equal": f"{agree}/{batch}"})  # fmt: skip
            print(json.dumps(out["rows"][-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=2) + "\n")
    for engine in engines.values():
        engine.runner.check_accounting()
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0 if out["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
