"""`python -m bench.chunk_cost`: what a prefill chunk of C tokens costs at each offset, against a one-piece prefill.

The target engine in process (the demo target, float32, CPU), prefix cache off. Per repeat, interleaved:

    tokens      a prompt of ``--chunks`` x C tokens, a chunk of C per forward (``PrefillItem.max_tokens`` /
                ``resume``), each chunk timed alone: offsets 0, C, 2C, ...
    equal-cost  a prompt of ``--one-piece`` tokens in the chunks the scheduler now grants (cost-capped:
                ``tokens_within`` at each offset, r from the target's shape; scheduler/policies/prefill_split.py)
    one-piece   the same prompt in one forward

A chunk of t tokens at offset o attends t*o + t^2/2 (query, key) pairs, so where attention is a material share
of the forward, later chunks of C tokens cost more (docs/policies/prefill-split.md, rule 1). Prints the median
and spread of each forward.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from bench.prefill import MODELS
from scheduler.policies.prefill_split import chunk_cost, pair_cost, tokens_within


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4, help="chunks per prompt (offsets 0, C, 2C, ...)")
    ap.add_argument("--one-piece", type=int, default=2000, help="tokens of the one-piece prefill timed beside")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    from shared.engine.config import EngineConfig
    from shared.engine.factory import build_target_engine
    from shared.engine.model_shape import model_shape
    from shared.engine.types import PrefillItem

    config = EngineConfig(block_size=16, num_blocks=1024, prefix_caching=False)
    target, _ = build_target_engine(MODELS / "smollm2-135m-instruct", device="cpu", dtype="float32",
                                    engine_config=config, with_tokenizer=False)  # fmt: skip
    shape = model_shape(target.runner)
    r = pair_cost(shape.attention_width, shape.num_layers, shape.layer_params)
    rng = random.Random(0)
    c, n = args.chunk, args.one_piece
    plans = {"tokens": [c] * args.chunks, "equal-cost": equal_cost_chunks(n, c, r)}
    times: dict[str, list[float]] = {}
    for rep in range(args.repeats + 1):  # the first: warm-up, not recorded
        prompt = [rng.randrange(100, 40000) for _ in range(max(args.chunks * c, n))]
        for plan, sizes in plans.items():
            seq, offset = f"{plan}{rep}", 0
            for i, t in enumerate(sizes):
                t0 = time.perf_counter()
                target.prefill([PrefillItem(seq, prompt[: sum(sizes)] if i == 0 else [], max_tokens=t, resume=i > 0)])
                if rep:
                    times.setdefault(f"{plan} {t}@{offset}", []).append(time.perf_counter() - t0)
                offset += t
            target.release([seq])
        t0 = time.perf_counter()
        target.prefill([PrefillItem(f"o{rep}", prompt[:n])])
        if rep:
            times.setdefault(f"one-piece {n}", []).append(time.perf_counter() - t0)
        target.release([f"o{rep}"])
    print(f"r = alpha / gamma from the shape: {r:.3g}")
    base = times[f"tokens {c}@0"]
    for name, xs in times.items():  # x: the median over repeats of its time / the same repeat's first chunk
        x = statistics.median(t / b for t, b in zip(xs, base))
        print(f"{name:>22}: median {statistics.median(xs) * 1e3:7.1f} ms  (min {min(xs) * 1e3:.1f}, "
              f"max {max(xs) * 1e3:.1f})  x{x:.2f} of tokens {c}@0")  # fmt: skip
    whole = times[f"one-piece {n}"]
    for plan in plans:  # what the p99 of a decoding request's gap compares: the dearest chunk against the whole
        dearest = [max(ts) for ts in zip(*(xs for k, xs in times.items() if k.startswith(plan + " ")))]
        ratios = [w / d for w, d in zip(whole, dearest)]
        print(f"one-piece / dearest {plan} chunk per repeat: {', '.join(f'{q:.2f}' for q in ratios)}"
              f" (median {statistics.median(ratios):.2f})")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"chunk": c, "pair_cost": r, "repeats": args.repeats, "seconds": times}, f, indent=1)


def equal_cost_chunks(n: int, c: int, r: float) -> list[int]:
    """The chunks of an n-token prompt, each costing at most what c tokens cost at offset 0 (rule 1)."""
    sizes, done = [], 0
    while done < n:
        sizes.append(min(n - done, tokens_within(chunk_cost(c, 0, r), done, r)))
        done += sizes[-1]
    return sizes


if __name__ == "__main__":
    main()
