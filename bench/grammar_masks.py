"""Per-token mask time of the two grammar engines on the demo tokenizer: ``python -m bench.grammar_masks``.

Both engines walk the same valid JSON document token by token (the demo target's tokenizer,
SmolLM2, 49,152 tokens) under the same JSON schema; per token they compute the mask of allowed
next tokens into a bitmask (what verification needs per tree node) and consume the token:

    llguidance     LLMatcher.unsafe_compute_mask_ptr (an Earley parser over a lexer; masks on demand)
    outlines-core  Guide.write_mask_into (a DFA index over the vocabulary, built once per regex)

Printed per engine: compile time (grammar + index), first mask, then median / p90 / max over the
rest, over ``--repeats`` walks (a fresh matcher each walk). ``--json`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "tags", "role"],
}
DOCUMENT = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "poetry"], "role": "admin"}'


def _byte_vocab(tokenizer) -> dict[bytes, list[int]]:
    """Token bytes -> ids for a byte-level BPE tokenizer (what outlines-core's Vocabulary takes)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    to_byte = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            to_byte[chr(256 + extra)] = b
            extra += 1
    special = set(tokenizer.all_special_ids)
    vocab: dict[bytes, list[int]] = {}
    for text, token_id in tokenizer.get_vocab().items():
        if token_id in special:
            continue
        raw = bytes(to_byte[c] for c in text) if all(c in to_byte for c in text) else text.encode()
        vocab.setdefault(raw, []).append(token_id)
    return vocab


def walk_llguidance(tokenizer, token_ids: list[int]) -> dict:
    import llguidance.hf
    from llguidance import LLMatcher

    start = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    matcher = LLMatcher(ll_tokenizer, LLMatcher.grammar_from_json_schema(SCHEMA))
    compile_s = time.perf_counter() - start
    bitmask = np.zeros((ll_tokenizer.vocab_size + 31) // 32, dtype=np.int32)  # [words]

    def mask() -> None:
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)

    return _walk(mask, matcher.consume_token, bitmask, token_ids) | {"setup_s": setup, "compile_s": compile_s}


def walk_outlines(tokenizer, token_ids: list[int]) -> dict:
    import outlines_core as oc

    start = time.perf_counter()
    vocabulary = oc.Vocabulary(tokenizer.eos_token_id, _byte_vocab(tokenizer))
    setup = time.perf_counter() - start
    start = time.perf_counter()
    index = oc.Index(oc.json_schema.build_regex_from_schema(json.dumps(SCHEMA)), vocabulary)
    guide = oc.Guide(index)
    compile_s = time.perf_counter() - start
    bitmask = np.zeros((len(tokenizer) + 31) // 32, dtype=np.int32)  # [words]

    def mask() -> None:
        guide.write_mask_into(bitmask.ctypes.data, bitmask.size, 4)

    return _walk(mask, guide.advance, bitmask, token_ids) | {"setup_s": setup, "compile_s": compile_s}


def _walk(mask, consume, bitmask: np.ndarray, token_ids: list[int]) -> dict:
    times = []
    for token in token_ids:
        start = time.perf_counter()
        mask()
        times.append(time.perf_counter() - start)
        if not (int(bitmask[token // 32]) >> (token % 32)) & 1:
            raise RuntimeError(f"token {token} of the document is not allowed by the grammar")
        consume(token)
    return {"first_us": times[0] * 1e6, "rest_us": [t * 1e6 for t in times[1:]]}


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", type=Path, default=Path.home() / ".cache/tandem/models/smollm2-135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    token_ids = tokenizer.encode(DOCUMENT)
    rows = {}
    for name, walk in (("llguidance", walk_llguidance), ("outlines-core", walk_outlines)):
        runs = [walk(tokenizer, token_ids) for _ in range(args.repeats)]
        rest = sorted(t for r in runs for t in r["rest_us"])
        rows[name] = {
            "tokens": len(token_ids),
            "setup_s": statistics.median(r["setup_s"] for r in runs),
            "compile_ms": statistics.median(r["compile_s"] for r in runs) * 1e3,
            "first_mask_us": statistics.median(r["first_us"] for r in runs),
            "mask_median_us": statistics.median(rest),
            "mask_p90_us": rest[int(0.9 * len(rest))],
            "mask_max_us": rest[-1],
        }
    report = {"machine": platform.platform(), "vocab": len(tokenizer), "schema": SCHEMA, "document": DOCUMENT,
              "engines": rows}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{len(token_ids)} tokens, vocabulary {len(tokenizer)}; {args.repeats} walks each")
    print(f"{'engine':<14} {'setup s':>8} {'compile ms':>11} {'first us':>9} {'median us':>10} {'p90 us':>8} {'max us':>8}")
    for name, r in rows.items():
        print(f"{name:<14} {r['setup_s']:8.2f} {r['compile_ms']:11.1f} {r['first_mask_us']:9.0f} "
              f"{r['mask_median_us']:10.1f} {r['mask_p90_us']:8.1f} {r['mask_max_us']:8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
