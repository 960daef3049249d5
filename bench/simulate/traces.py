"""Record an acceptance trace from real runs of one draft on the demo target (in-process, batch 1).

    python -m bench.simulate trace --draft demo      # the pair's distilled draft
    python -m bench.simulate trace --draft ngram     # prompt lookup      (model-free)
    python -m bench.simulate trace --draft suffix    # suffix trees       (model-free)
    python -m bench.simulate trace --draft eagle     # the EAGLE-3 head, when prepared

Every prompt kind of bench.prompts, a chain of k per request, an AcceptanceRecorder on
the scheduler -> bench/results/simulate/traces/trace-<draft>.json.

Model-free drafts propose nothing when the context has no match; such steps are plain
decodes and are not counted, so the trace's p_i describe the steps that did draft and
the simulator (which drafts every step) overstates how often those drafts speculate.
"""

from __future__ import annotations

import asyncio
import platform
import time
from pathlib import Path

from bench.prompts import KINDS
from bench.simulate.fidelity import LocalBackend
from bench.simulate.recorder import AcceptanceRecorder
from bench.simulate.runner import Phases, SimOptions
from scheduler.engine_loop import SchedulerConfig


def _draft_engine(draft: str, models, vocab_size: int):
    from shared.engine import factory

    if draft == "ngram":
        return factory.build_ngram_draft_engine(vocab_size=vocab_size), "ngram"
    if draft == "suffix":
        return factory.build_suffix_draft_engine(vocab_size=vocab_size), "suffix"
    if draft == "eagle":
        from bench.stack import Models

        eagle = Models(pair="eagle", home=models.home)
        engine = factory.build_feature_draft_engine(eagle.draft_dir(), target_dir=eagle.target_dir(), device="cpu",
                                                    dtype="float32")  # fmt: skip
        return engine, "smollm2-eagle3"
    engine, loaded = factory.build_draft_engine(models.draft_dir(), device="cpu", dtype="float32", with_tokenizer=False)
    return engine, loaded.name


def record_trace(draft: str, out_dir: Path, prompts_per_kind: int = 3, k: int = 4, max_new_tokens: int = 64,
                 log=print) -> Path:  # fmt: skip
    from bench.stack import Models
    from bench.tokens import PromptEncoder
    from shared.engine.factory import build_target_engine

    models = Models(pair="eagle" if draft == "eagle" else "demo")
    target, t_loaded = build_target_engine(models.target_dir(), device="cpu", dtype="float32", with_tokenizer=False)
    engine, draft_name = _draft_engine(draft, models, t_loaded.vocab_size)
    encoder = PromptEncoder.for_model(models.target_dir())
    recorder = AcceptanceRecorder(draft=draft_name, target=t_loaded.name)
    started = time.time()
    for i, kind in enumerate(KINDS):
        opts = SimOptions(name=f"trace-{draft}", batch1=[f"tandem-k{k}"], sweep=[], num_prompts=prompts_per_kind,
                          max_new_tokens=max_new_tokens, prompt_mix={kind: 1.0}, baseline_tpot_ms=1.0,
                          baseline_ttft_s=0.0, seed=i)  # fmt: skip
        backend = LocalBackend(target, engine, encoder.eos_token_ids, SchedulerConfig(), recorder)
        asyncio.run(Phases(opts, backend, encoder, log=lambda _: None).run())
        c = recorder.counts.get(kind)
        log(f"{draft} {kind}: {c.num_steps if c else 0} chain steps, p_i {[round(p, 2) for p in c.rates()] if c else []}")
    source = (f"python -m bench.simulate trace --draft {draft}: {prompts_per_kind} prompts per kind, k={k}, "
              f"{max_new_tokens} new tokens, batch 1, {platform.node()}, {time.strftime('%Y-%m-%d')}, "
              f"{time.time() - started:.0f} s")  # fmt: skip
    path = recorder.trace(source).save(out_dir / f"trace-{draft}.json")
    write_readme(out_dir)
    return path


def write_readme(out_dir: Path) -> Path:
    """README.md of the traces folder: per trace, how it was recorded and p_i per prompt kind."""
    from bench.simulate.acceptance import load_trace

    lines = ["# Acceptance traces", "", "Recorded by `python -m bench.simulate trace --draft <draft>` "
             "(bench/simulate/traces.py); read by `tandem simulate` (docs/simulate.md).", ""]  # fmt: skip
    for path in sorted(out_dir.glob("trace-*.json")):
        trace = load_trace(path)
        lines += [f"## {path.name}: {trace.draft} on {trace.target}", "", f"{trace.source}", "",
                  "| kind | chain steps | p_i by position | mean accepted of a k = 3 chain |", "|---|---|---|---|"]  # fmt: skip
        for kind, c in sorted(trace.kinds.items()):
            lines.append(f"| {kind} | {c.num_steps} | {', '.join(f'{p:.2f}' for p in c.rates())} | "
                         f"{trace.mean_accepted(kind, 3):.2f} |")  # fmt: skip
        lines.append("")
    out = out_dir / "README.md"
    out.write_text("\n".join(lines))
    return out
