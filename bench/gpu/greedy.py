"""Greedy decoding on any device, through Tandem's engines and through HF ``generate`` (the GPU test and bench).

    engine = target_engine(model, "flashinfer")                     # a TargetEngine over its own KV pool
    out = tandem_decode(engine, prompts, 48)                         # batched: prefill, then empty-tree verifies
    out = speculative_decode(engine, draft_engine, prompts, 48, k=4) # chain of k per step, greedy acceptance
    ref = hf_generate(hf_model, prompt, 48, pad_id)                  # one prompt (batch 1, no padding)
    reference = margins_and_delta(hf_model, engine.runner, prompt, ref)

The Tandem model and the HF model must be two copies of the same weights: the runner routes its
model's attention to Tandem's backends, which HF ``generate`` cannot use.
"""

from __future__ import annotations

import torch

from shared.engine.config import EngineConfig
from shared.engine.draft_engine import DraftEngine
from shared.engine.runner import ModelRunner, Work
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SpecItem, TokenTree, VerifyItem

PROMPTS = [
    "Explain why the sky is blue to a ten-year-old.",
    "Write a short poem about the sea at night.",
    "What are the main differences between Python lists and tuples?",
    "Give me three tips for a good night's sleep.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How does a refrigerator keep food cold?",
    "Write a Python function that reverses a string.",
    "What is the capital of Australia, and why was it chosen?",
    "Describe the water cycle step by step.",
    "List five fruits that are rich in vitamin C.",
    "Why do cats purr?",
    "Explain recursion with a simple example.",
    "What should I pack for a weekend hiking trip?",
    "How do vaccines train the immune system?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What is the difference between weather and climate?",
]


def chat_prompts(tokenizer, n: int) -> list[list[int]]:
    """``n`` chat-templated prompts (the list repeated as needed), as token id lists."""
    texts = (PROMPTS * (n // len(PROMPTS) + 1))[:n]
    out = []
    for text in texts:
        enc = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True)  # fmt: skip
        out.append(list(enc["input_ids"]) if hasattr(enc, "keys") else list(enc))
    return out


def target_engine(model, backend: str = "auto", *, num_blocks: int | None = None, block_size: int = 16,
                  kv_cache_bytes: int | None = None) -> TargetEngine:  # fmt: skip
    fields = {"block_size": block_size, "attention_backend": backend}
    if num_blocks is not None:
        fields["num_blocks"] = num_blocks
    if kv_cache_bytes is not None:
        fields["kv_cache_bytes"] = kv_cache_bytes
    return TargetEngine(ModelRunner(model, EngineConfig(**fields), name=f"target:{backend}"))


def tandem_decode(engine: TargetEngine, prompts: list[list[int]], new_tokens: int, tag: str = "g") -> list[list[int]]:
    """``new_tokens`` greedy tokens per prompt, all prompts in one batch per forward."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    firsts = engine.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)])
    out = [[r.first_token] for r in firsts]
    empty = TokenTree(token_ids=[], parent_ids=[])
    try:
        for _ in range(new_tokens - 1):
            for o, r in zip(out, engine.verify([VerifyItem(s, empty) for s in ids])):
                o.extend(r.tokens)
    finally:
        engine.release(ids)
    return out


def speculative_decode(target: TargetEngine, draft: DraftEngine, prompts: list[list[int]], new_tokens: int, *,
                       k: int = 4, tree: tuple[int, int] | None = None,
                       tag: str = "sd") -> tuple[list[list[int]], dict]:  # fmt: skip
    """Greedy speculative decoding with a chain of ``k`` per step, or a beam-search tree of ``tree`` =
    (depth, width) (AdaServe's candidate trees); returns outputs and acceptance stats."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    outs = {s: [] for s in ids}
    new = {}
    for r in target.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)]):
        outs[r.seq_id].append(r.first_token)
        new[r.seq_id] = [r.first_token]
    draft.prefill([PrefillItem(s, p) for s, p in zip(ids, prompts)])
    steps = proposed = accepted = 0
    try:
        while live := [s for s in ids if len(outs[s]) < new_tokens]:
            shape = {"chain_len": k} if tree is None else {"tree_depth": tree[0], "tree_width": tree[1]}
            trees = draft.speculate([SpecItem(s, new[s], **shape) for s in live])
            for s, proposal, res in zip(live, trees, target.verify([VerifyItem(s, t) for s, t in zip(live, trees)])):
                outs[s] += res.tokens
                new[s] = res.tokens
                proposed += len(proposal)
                accepted += len(res.tokens) - 1
            steps += 1
    finally:
        target.release(ids)
        draft.release(ids)
    stats = {"steps": steps, "proposed": proposed, "accepted": accepted,
             "acceptance_rate": accepted / proposed if proposed else 0.0}  # fmt: skip
    return [outs[s][:new_tokens] for s in ids], stats


@torch.inference_mode()
def hf_generate(model, prompts: list[list[int]], new_tokens: int, pad_id: int, *, exact: bool = True) -> list[list[int]]:
    """HF ``generate``, greedy; left padding when the batch has several prompts.

    ``exact``: exactly ``new_tokens`` each (min_new_tokens, for timing: it masks the end-of-sequence
    token until then, so the tokens are not plain greedy past a would-be stop). Otherwise it stops
    at end-of-sequence (the token included) and a batch-1 call returns only what it generated:
    what the agreement tests compare against, up to that stop."""
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    extra = {"min_new_tokens": new_tokens} if exact else {}
    out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=pad_id, **extra)  # fmt: skip
    return out[:, width:].tolist()


@torch.inference_mode()
def margins_and_delta(hf_model, runner: ModelRunner, prompt: list[int], ref: list[int], *,
                      fp32_model=None) -> dict:  # fmt: skip
    """Teacher-forced on ``prompt + ref``: per generated position the reference's top-2 margin ("margins")
    and top logit ("tops"), and "delta", the largest |logit difference| between HF and Tandem's runner
    there (a verify of ``ref`` as a chain): the keyword arguments of ``agreement.judge``. With
    ``fp32_model`` (the same weights in float32) also "noise": HF's own largest |logit difference| from it."""
    device = next(hf_model.parameters()).device
    n = len(ref)
    ids = torch.tensor([prompt + ref], device=device)
    hf_logits = hf_model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n].float()  # [n, vocab]
    top2 = hf_logits.topk(2, dim=-1).values
    margins = (top2[:, 0] - top2[:, 1]).tolist()
    tops = top2[:, 0].tolist()
    seq_id = f"tf-{id(ref)}"
    seq = runner.add(seq_id, list(prompt))
    try:
        work = Work(seq, new_nodes=[(t, j - 1) for j, t in enumerate(ref[: n - 1])], want_root=True,
                    want_nodes=n > 1)  # fmt: skip
        out = runner.forward([work])
        rows = [out.root(0)[None]] + ([out.nodes(0, n - 1)] if n > 1 else [])
        tandem_logits = torch.cat(rows).float()  # [n, vocab]
        runner.commit(seq, [])
    finally:
        runner.release(seq_id)
    delta = float((tandem_logits - hf_logits).abs().max())
    found = {"margins": margins, "tops": tops, "delta": delta}
    if fp32_model is not None:
        fp32_logits = fp32_model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + n].float()
        found["noise"] = float((fp32_logits - hf_logits).abs().max())
    return found
