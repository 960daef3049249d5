"""How far bf16 logits move on their own: the scale the greedy tests' δ bound must sit on.

The greedy GPU tests bound δ (the largest |logit difference| between Tandem and HF, teacher-forced on
HF's output) by a fixed 1.0 in bfloat16. Whether flashinfer's δ of 0.7-1.05 on an H200 is a bug or
bf16 rounding is answered by measuring what a mere change of kernels does inside HF itself:

    bf16-sdpa  vs fp32-sdpa    bf16's own error (what every bf16 implementation carries)
    bf16-eager vs bf16-sdpa    another attention kernel, same dtype (what flashinfer is to SDPA)

each as the largest |logit difference| over the generated positions of the greedy tests' prompts
(HF bf16 SDPA's greedy output, 48 tokens), with the top logits' size beside it.

    python -m bench.gpu.bf16_noise --device cuda --out bf16_noise.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

NEW_TOKENS = 48
NUM_PROMPTS = 4


@torch.inference_mode()
def teacher_forced(model, prompt: list[int], ref: list[int]) -> torch.Tensor:
    device = next(model.parameters()).device
    ids = torch.tensor([prompt + ref], device=device)
    return model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ref)].float()


def measure(target_dir: Path, device: str, num_prompts: int = NUM_PROMPTS, new_tokens: int = NEW_TOKENS) -> dict:
    from bench.gpu.greedy import chat_prompts, hf_generate
    from shared.engine.loading import load_causal_lm

    loaded = {
        "fp32-sdpa": load_causal_lm(target_dir, dtype="float32", device=device),
        "bf16-sdpa": load_causal_lm(target_dir, dtype="bfloat16", device=device, with_tokenizer=False),
        "bf16-eager": load_causal_lm(target_dir, dtype="bfloat16", device=device, with_tokenizer=False),
    }
    loaded["bf16-eager"].model.set_attn_implementation("eager")
    for item in loaded.values():
        if item.model.config._attn_implementation != "eager":
            item.model.set_attn_implementation("sdpa")
    tokenizer = loaded["fp32-sdpa"].tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    pairs = [("bf16-sdpa", "fp32-sdpa"), ("bf16-eager", "fp32-sdpa"), ("bf16-eager", "bf16-sdpa")]
    rows = []
    for prompt in chat_prompts(tokenizer, num_prompts):
        ref = hf_generate(loaded["bf16-sdpa"].model, [prompt], new_tokens, pad, exact=False)[0]
        logits = {name: teacher_forced(item.model, prompt, ref) for name, item in loaded.items()}
        row = {"tokens": len(ref), "top_abs_max": float(logits["fp32-sdpa"].max(-1).values.abs().max())}
        for a, b in pairs:
            row[f"{a} vs {b}"] = float((logits[a] - logits[b]).abs().max())
        rows.append(row)
    return {"device": device, "prompts": rows,
            "max": {f"{a} vs {b}": max(r[f"{a} vs {b}"] for r in rows) for a, b in pairs}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from shared.models.paths import Paths
    from shared.models.registry import get_pair

    parser = argparse.ArgumentParser(prog="python -m bench.gpu.bf16_noise")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    target_dir = Paths.resolve().model_dir(get_pair("demo").target.name)
    result = measure(target_dir, args.device)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
