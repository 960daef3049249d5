"""`make bench-drafts`: the drafts side by side, by task kind.

    python -m bench.drafts [--repeats 3] [--prompts 8] [--feature-draft smollm2-eagle3]

Two workloads, each one harness run with every stack up at once and configurations interleaved
(bench.harness, ``interleave``): the open-chat prompts (held out from every training corpus) and
the grounded prompts (summarise, rewrite, answer over context, agent transcripts; bench/prompts.py).
Each compares, on the same target, plain decoding with the feature-level draft (EAGLE-3 head,
chains of FEATURE_KS), the n-gram prompt-lookup draft and the suffix-tree draft (chains of 4):

    batch 1      every prompt, configurations rotated, ``repeats`` passes
    4 at once    closed loop at concurrency 4, one pass per repeat

Every repeat, pass and the warm-up draw their own prompts (``distinct_prompts``): the suffix
draft's global tree remembers earlier outputs, and a repeated prompt would be answered from
memory (an earlier run that repeated them measured the suffix draft at 1.23x target-only on
chat in its first repeat and 3.1x in the next two).

Per configuration, per task kind and per repeat: output tokens/s (tokens over the requests'
summed latency at batch 1; over the pass's wall time at concurrency 4), its ratio to target-only
in the same repeat, and the mean accepted length per verify (accepted draft tokens + the bonus
token, per step). The table gives the median over repeats and the min-max spread; a goal met
in one repeat of three is not met. Results: bench/results/drafts-<pair>/{drafts.json,README.md}
beside each workload's own harness results.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import sys
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import typer
from rich.console import Console

from bench.harness import RESULTS_ROOT, BenchOptions, Harness, machine
from bench.options import WORKLOADS as ALL_WORKLOADS
from bench.stack import Models

FEATURE_KS = (2, 4)
MODEL_FREE = ("ngram", "suffix")
WORKLOADS = {k: ALL_WORKLOADS[k] for k in ("chat", "grounded")}
_REP = re.compile(r"-r(\d+)-")


def configs(feature_draft: str | None, model_free: tuple[str, ...] = MODEL_FREE, k: int = 4,
            extra: tuple[str, ...] = ()) -> list[str]:
    """target-only, the feature draft at FEATURE_KS, the model-free drafts at k, then ``extra`` (draft:<x>:k<K> names)."""
    out = ["target-only"]
    if feature_draft:
        out += [f"draft:{feature_draft}:k{kk}" for kk in FEATURE_KS]
    out += [f"draft:{m}:k{k}" for m in model_free]
    return out + [f"draft:{e}" for e in extra]


def _rep(record, phase: str) -> int:
    if phase == "closed":  # one closed pass per repeat: its index is in the job tag (closed<ci>)
        m = re.search(r"/closed(\d+)-", record.job.request_id)
    else:
        m = _REP.search(record.job.request_id)
    return int(m.group(1)) if m else 0


def _stats(records, phase: str) -> dict:
    """tokens/s and tokens per verify step of one group of records."""
    ok = [r for r in records if not r.error and r.trace.num_tokens]
    tokens = sum(r.trace.num_tokens for r in ok)
    if not ok:
        return {"tok_s": None, "tokens_per_step": None, "requests": 0}
    if phase == "closed":
        start = min(r.trace.sent_s for r in ok)
        wall = max(r.trace.sent_s + (r.trace.latency_s or 0) for r in ok) - start
    else:
        wall = sum(r.trace.latency_s or 0 for r in ok)
    steps = sum(r.trace.num_steps for r in ok)
    accepted = sum(r.trace.num_accepted_tokens for r in ok)
    return {
        "tok_s": tokens / wall if wall > 0 else None,
        "tokens_per_step": (steps + accepted) / steps if steps else None,
        "requests": len(ok),
    }


def by_kind(harness: Harness) -> dict:
    """phase -> kind ("all" too) -> config -> [per-repeat stats]."""
    out: dict = {}
    for phase, load in (("batch1", "batch=1"), ("closed", "concurrency=4")):
        groups: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        for config, records in harness.records.get(phase, {}).get(load, {}).items():
            for r in records:
                for kind in ("all", r.job.encoded.item.prompt.kind):
                    groups[kind][config][_rep(r, phase)].append(r)
        out[phase] = {
            kind: {c: [_stats(reps[i], phase) for i in sorted(reps)] for c, reps in per_config.items()}
            for kind, per_config in groups.items()
        }
    return out


def summary(stats: dict) -> dict:
    """Median and spread over repeats of tok/s, ratio to target-only (same repeat) and tokens per step."""
    out: dict = {}
    for phase, kinds in stats.items():
        for kind, per_config in kinds.items():
            base = per_config.get("target-only", [])
            for config, reps in per_config.items():
                ratios = [r["tok_s"] / b["tok_s"] for r, b in zip(reps, base) if r["tok_s"] and b["tok_s"]]
                tps = [r["tokens_per_step"] for r in reps if r["tokens_per_step"]]
                out.setdefault(phase, {}).setdefault(kind, {})[config] = {
                    "tok_s": _median([r["tok_s"] for r in reps if r["tok_s"]]),
                    "ratio": _median(ratios),
                    "ratio_min": min(ratios) if ratios else None,
                    "ratio_max": max(ratios) if ratios else None,
                    "ratios": ratios,
                    "tokens_per_step": _median(tps),
                    "repeats": len(reps),
                    "requests": sum(r["requests"] for r in reps),
                }
    return out


def _median(xs):
    return statistics.median(xs) if xs else None


def render(meta: dict, results: dict) -> str:
    lines = [f"# Drafts side by side: {meta['date']}", "", f"Command: `{meta['command']}`  ",
             f"Machine: {meta['machine']}  ", f"Target: {meta['target']}; feature draft: {meta['feature_draft']}", "",
             "Ratios are tokens/s over target-only in the same repeat: median [min-max] over repeats. "
             "Tokens per step = accepted draft tokens + the bonus token, per verify.", ""]
    for workload, res in results.items():
        for phase, title in (("batch1", "batch 1"), ("closed", "4 concurrent requests")):
            kinds = res.get(phase, {})
            if not kinds:
                continue
            lines += [f"## {workload}, {title}", "", "| kind | config | tok/s | × target-only | tokens/step | requests |",
                      "|---|---|---|---|---|---|"]
            for kind in sorted(kinds, key=lambda k: (k != "all", k)):
                for config, s in kinds[kind].items():
                    ratio = "–" if s["ratio"] is None else f"{s['ratio']:.2f} [{s['ratio_min']:.2f}-{s['ratio_max']:.2f}]"
                    tps = "–" if s["tokens_per_step"] is None else f"{s['tokens_per_step']:.2f}"
                    tok = "–" if s["tok_s"] is None else f"{s['tok_s']:.1f}"
                    lines.append(f"| {kind} | {config} | {tok} | {ratio} | {tps} | {s['requests']} |")
            lines.append("")
    return "\n".join(lines)


def run(models: Models, feature_draft: str | None, *, name: str, extra: tuple[str, ...] = (), prompts: int, repeats: int, max_new_tokens: int,
        closed_requests: int, workloads: list[str], console: Console, root: Path = RESULTS_ROOT,
        max_prompt_tokens: int = 1536) -> dict:
    out_dir = root / name
    results, harness_dirs = {}, {}
    for workload in workloads:
        opts = BenchOptions(
            name=f"{name}/{workload}", models=models, batch1=configs(feature_draft, extra=extra),
            sweep=configs(feature_draft, extra=extra),
            num_prompts=prompts, repeats=repeats, max_new_tokens=max_new_tokens, rate_factors=[],
            concurrency=[4] * repeats, closed_factor=1, sweep_requests=closed_requests,
            sweep_max_new_tokens=max_new_tokens, prompt_mix=WORKLOADS[workload], interleave=True, traces=False,
            distinct_prompts=True,
            max_prompt_tokens=max_prompt_tokens,
        )
        wdir = out_dir / workload
        wdir.mkdir(parents=True, exist_ok=True)
        harness = Harness(opts, wdir, console)
        raw = asyncio.run(harness.run())
        (wdir / "results.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
        results[workload] = summary(by_kind(harness))
        harness_dirs[workload] = str(wdir.relative_to(root))
    meta = {
        "command": "python -m bench.drafts " + " ".join(sys.argv[1:]),
        "machine": machine(2),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "target": str(models.target_dir()),
        "feature_draft": feature_draft,
        "harness_results": harness_dirs,
    }
    (out_dir / "drafts.json").write_text(json.dumps(meta | {"results": results}, indent=2) + "\n")
    text = render(meta | {"machine": _machine_line(meta["machine"])}, results)
    (out_dir / "README.md").write_text(text + "\n")
    console.print(text)
    return results


def _machine_line(m) -> str:
    return ", ".join(f"{k} {v}" for k, v in m.items()) if isinstance(m, dict) else str(m)


app = typer.Typer(add_completion=False)


@app.command()
def main(
    pair: str = typer.Option("demo", help="Model pair whose target serves (its own draft is not used)."),
    feature_draft: str = typer.Option("smollm2-eagle3", help="Feature-level draft (model name or path); '' = none."),
    name: str = typer.Option("", help="Results folder (default drafts-<pair>)."),
    prompts: int = typer.Option(8, help="Batch-1 prompts per workload."),
    repeats: int = typer.Option(3, min=1),
    max_new_tokens: int = typer.Option(64),
    closed_requests: int = typer.Option(12, help="Requests per closed-loop pass at concurrency 4."),
    workloads: str = typer.Option("chat,grounded"),
    extra: str = typer.Option("smollm2-draft:k2", help="More drafts to compare, comma-separated <draft>:k<K> "
                              "(default: the demo pair's distilled draft)."),
    home: Path | None = typer.Option(None),
    target: Path | None = typer.Option(None, help="Target model directory (overrides the pair's)."),
    dtype: str = typer.Option("float32", help="Weights of both model services: float32, bfloat16 (CPUs with "
                              "native bf16 multiply it through oneDNN-prepacked weights), auto."),
) -> None:
    models = Models(pair=pair, home=home, target=target, dtype=dtype)
    run(models, feature_draft or None, name=name or f"drafts-{pair}", extra=tuple(e for e in extra.split(",") if e),
        prompts=prompts, repeats=repeats,
        max_new_tokens=max_new_tokens, closed_requests=closed_requests,
        workloads=[w for w in workloads.split(",") if w], console=Console())


if __name__ == "__main__":
    app()
