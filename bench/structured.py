"""JSON-schema output with speculation on vs off, in one run: ``python -m bench.structured``.

The demo pair in process (SmolLM2-135M-Instruct target, the distilled smollm2-draft; the engines
the services run, grammars from the target's tokenizer), greedy, chat prompts that ask for a person
as JSON under a schema. Configurations, interleaved within each repeat so machine load hits all:

    schema+spec    the grammar on, a draft chain of --k tokens per step
    schema         the grammar on, no speculation (one target step per token)
    free+spec      no grammar, the same prompts and chains (what the grammar does to acceptance)

at batch 1 and --batch. Reported per configuration: generated tokens/s (until EOS or --max-tokens),
acceptance (accepted / drafted tokens), tokens per sequence per target step, the grammar's host
time per (batched) target step, and whether the constrained answers parse and validate. Greedy constrained output with
speculation must equal it without: the run checks it and records the result. ``--out DIR`` writes
results.json and README.md there.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 32},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string", "maxLength": 32},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
PEOPLE = ["Ada Lovelace, 36, London", "Alan Turing, 41, Manchester", "Grace Hopper, 85, New York",
          "Marie Curie, 66, Paris", "Katherine Johnson, 101, Hampton", "Linus Torvalds, 54, Portland",
          "Hedy Lamarr, 85, Vienna", "Emmy Noether, 53, Erlangen"]  # fmt: skip


def prompts(tokenizer, batch: int) -> list[list[int]]:
    out = []
    for i in range(batch):
        text = f"Describe {PEOPLE[i % len(PEOPLE)]} as a JSON object with name, age and city."
        out.append(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False))  # fmt: skip
    return [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in out]


def run(target, draft, prompt_ids, *, grammar: bool, k: int, max_tokens: int, eos: int, tag: str) -> dict:
    from shared.engine.types import GrammarSpec, PrefillItem, SpecItem, TokenTree, VerifyItem

    ids = [f"{tag}-{i}" for i in range(len(prompt_ids))]
    items = [PrefillItem(s, p, grammar=GrammarSpec("json_schema", json.dumps(SCHEMA), start=len(p)) if grammar else None)
             for s, p in zip(ids, prompt_ids)]  # fmt: skip
    target.grammars.stats.take()
    start = time.perf_counter()
    outs = {r.seq_id: [r.first_token] for r in target.prefill(items)}
    if k:
        draft.prefill(items)
    new = {s: list(outs[s]) for s in ids}
    steps = seq_steps = drafted = accepted = 0
    live = [s for s in ids if outs[s][-1] != eos]
    while live:
        if k:
            trees = draft.speculate([SpecItem(s, new[s], chain_len=k) for s in live])
        else:
            trees = [TokenTree() for _ in live]
        results = target.verify([VerifyItem(s, t) for s, t in zip(live, trees)])
        steps += 1
        seq_steps += len(live)
        for s, tree, result in zip(live, trees, results):
            drafted += len(tree)
            accepted += result.num_accepted
            tokens = result.tokens
            if eos in tokens:
                tokens = tokens[: tokens.index(eos) + 1]
            outs[s] += tokens
            new[s] = result.tokens
        live = [s for s in live if outs[s][-1] != eos and len(outs[s]) < max_tokens]
    elapsed = time.perf_counter() - start
    _, grammar_s = target.grammars.stats.take()
    target.release(ids)
    if k:
        draft.release(ids)
    tokens = {s: [t for t in outs[s][:max_tokens] if t != eos] for s in ids}
    return {"seconds": elapsed, "tokens": sum(map(len, tokens.values())), "steps": steps, "drafted": drafted,
            "accepted": accepted, "seq_steps": seq_steps, "grammar_ms_per_step": 1e3 * grammar_s / max(1, steps),
            "outputs": [tokens[s] for s in ids]}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    import jsonschema

    from shared.engine.factory import build_draft_engine, build_target_engine
    from shared.engine.tokenizer_dir import load_tokenizer
    from shared.models.smollm2_draft import NAME

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    models = Path.home() / ".cache/tandem/models"
    parser.add_argument("--target", type=Path, default=models / "smollm2-135m-instruct")
    parser.add_argument("--draft", type=Path, default=models / NAME)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    target, _ = build_target_engine(args.target, device="cpu", dtype="float32")
    draft, _ = build_draft_engine(args.draft, device="cpu", dtype="float32")
    tokenizer = load_tokenizer(args.target)
    eos = tokenizer.eos_token_id
    target.grammars.ll_tokenizer, draft.grammars.ll_tokenizer  # built before the clock starts (about 3 s each)
    configs = {"schema+spec": (True, args.k), "schema": (True, 0), "free+spec": (False, args.k)}
    runs: dict[tuple[str, int], list[dict]] = {}
    for repeat in range(args.repeats):
        for batch in (1, args.batch):
            batch_prompts = prompts(tokenizer, batch)
            for name, (grammar, k) in configs.items():
                r = run(target, draft, batch_prompts, grammar=grammar, k=k, max_tokens=args.max_tokens, eos=eos,
                        tag=f"{name}-{batch}-{repeat}")  # fmt: skip
                runs.setdefault((name, batch), []).append(r)
                print(f"repeat {repeat} batch {batch} {name:<12} {r['tokens'] / r['seconds']:7.2f} tok/s "
                      f"acceptance {r['accepted'] / max(1, r['drafted']):.3f}", flush=True)  # fmt: skip
    rows = []
    for (name, batch), rs in runs.items():
        valid = 0
        for r in rs:
            for out in r["outputs"]:
                try:
                    jsonschema.validate(json.loads(tokenizer.decode(out)), SCHEMA)
                    valid += 1
                except (ValueError, jsonschema.ValidationError):
                    pass
        rows.append({"config": name, "batch": batch, "tok_s": statistics.median(r["tokens"] / r["seconds"] for r in rs),
                     "tok_s_runs": [round(r["tokens"] / r["seconds"], 2) for r in rs],
                     "acceptance": sum(r["accepted"] for r in rs) / max(1, sum(r["drafted"] for r in rs)),
                     "tokens_per_step": sum(r["tokens"] for r in rs) / sum(r["seq_steps"] for r in rs),
                     "grammar_ms_per_step": statistics.median(r["grammar_ms_per_step"] for r in rs),
                     "valid_json": f"{valid}/{sum(len(r['outputs']) for r in rs)}"})  # fmt: skip
    equal = all(a["outputs"] == b["outputs"] for batch in (1, args.batch)
                for a, b in zip(runs[("schema+spec", batch)], runs[("schema", batch)]))  # fmt: skip
    sample = tokenizer.decode(runs[("schema+spec", 1)][0]["outputs"][0])
    argv = sys.argv[1:] if argv is None else argv  # the command as run, for the results
    report = {"command": "python -m bench.structured " + " ".join(argv), "machine": _machine(),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": _commit(),
              "k": args.k, "max_tokens": args.max_tokens, "repeats": args.repeats, "schema": SCHEMA,
              "greedy_equal": equal, "sample": sample, "rows": rows}  # fmt: skip
    print(_table(report))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
        (args.out / "README.md").write_text(_readme(report))


def _table(report: dict) -> str:
    lines = ["| config | batch | tokens/s | acceptance | tokens per target step | grammar ms per step | valid JSON |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["rows"]:
        lines.append(f"| {r['config']} | {r['batch']} | {r['tok_s']:.2f} | {r['acceptance']:.3f} | "
                     f"{r['tokens_per_step']:.2f} | {r['grammar_ms_per_step']:.2f} | {r['valid_json']} |")  # fmt: skip
    return "\n".join(lines)


def _readme(report: dict) -> str:
    return (f"# Structured output with speculation on vs off: {report['date']}\n\n"
            f"Command: `{report['command'].strip()}`  \nMachine: {report['machine']}  \nCommit: {report['commit']}  \n"
            f"Demo pair in process, greedy, JSON schema below, draft chains of k = {report['k']}, "
            f"at most {report['max_tokens']} tokens, {report['repeats']} repeat(s), configurations interleaved.\n\n"
            f"{_table(report)}\n\n"
            f"Greedy constrained output with speculation equal to it without: **{report['greedy_equal']}**.  \n"
            f"A batch-1 answer: `{report['sample']}`\n\n"
            f"Schema: `{json.dumps(report['schema'])}`\n")  # fmt: skip


def _machine() -> str:
    import os

    import torch

    return f"{platform.platform()}, cpu_count {os.cpu_count()}, torch {torch.__version__}"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
