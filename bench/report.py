"""From driver runs to results: per-configuration summaries, acceptance, paired speedups, the rich tables.

Every number a configuration gets comes from bench.metrics.summarize over its
client-side traces, plus what only the whole run can say:

- paired speedup: batch-1 runs interleave configurations prompt by prompt, so
  the ratio of two configurations' latencies on the *same* prompt, moments
  apart, cancels most machine noise; the median over prompts is reported
  next to the plain ratio of throughputs
- lossless check: under greedy decoding every configuration must produce the
  target's tokens; outputs are compared prompt by prompt with target-only
- acceptance: histogram of accepted draft tokens per step, of per-request
  acceptance rates, and (from the scheduler's counters) per-position acceptance
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from bench.drivers import Record
from bench.metrics import RequestTrace, percentile, summarize


def batch1_wall_s(records: Sequence[Record]) -> float:
    """Busy time of a configuration whose requests ran alone: the sum of their latencies."""
    return sum(r.trace.latency_s or 0.0 for r in records) or 1e-9


def acceptance(records: Sequence[Record]) -> dict:
    """Histograms of accepted draft tokens per step and per-request acceptance rates."""
    steps = Counter(a for r in records for a in r.step_accepts)
    rates = [r.trace.num_accepted_tokens / r.trace.num_draft_tokens for r in records if r.trace.num_draft_tokens]
    tokens_per_step = [t for r in records for t in r.step_tokens]
    return {
        "accepted_per_step_hist": {str(k): steps[k] for k in sorted(steps)},
        "request_acceptance_rates": rates,
        "mean_tokens_per_step": statistics.fmean(tokens_per_step) if tokens_per_step else None,
    }


def output_lengths(records: Sequence[Record]) -> dict:
    """How well ``max_new_tokens`` foretells a request's output: the length predictors' raw material.

    ``stopped_early``: share that ended before their bound (stop token); ``rank_corr``: Spearman's
    correlation of bound and actual length (1: the bound orders requests exactly as their lengths do).
    """
    pairs = [(r.job.encoded.item.max_new_tokens, r.trace.num_tokens) for r in records if r.trace.ok]
    if not pairs:
        return {"mean_tokens": None, "mean_max_new_tokens": None, "stopped_early": None, "rank_corr": None}
    bounds, lengths = zip(*pairs)
    return {
        "mean_tokens": statistics.fmean(lengths),
        "mean_max_new_tokens": statistics.fmean(bounds),
        "stopped_early": sum(n < b for b, n in pairs) / len(pairs),
        "rank_corr": _spearman(bounds, lengths),
    }


def request_rows(records: Sequence[Record]) -> list[dict]:
    """One row per request: its bound, prompt and output length, when it was sent, its TTFT and latency (s).

    What an order policy moves is who waits and for how long; these rows let a reader replay the order
    (e.g. against shortest-job-first on the actual lengths) without rerunning the stack.
    """
    return [{"id": r.job.request_id, "max_new_tokens": r.job.encoded.item.max_new_tokens,
             "prompt_tokens": len(r.job.encoded.prompt_ids), "tokens": r.trace.num_tokens,
             "steps": r.trace.num_steps, "sent_s": round(r.trace.sent_s, 4),
             "ttft_s": None if r.trace.ttft_s is None else round(r.trace.ttft_s, 4),
             "latency_s": None if r.trace.latency_s is None else round(r.trace.latency_s, 4),
             "finish": r.trace.finish_reason} for r in records]  # fmt: skip


def _spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):  # ties share their mean rank
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    try:
        return statistics.correlation(rx, ry)
    except statistics.StatisticsError:  # a constant side
        return None


def summarize_records(records: Sequence[Record], wall_s: float) -> dict:
    out = summarize([r.trace for r in records], wall_s).as_dict()
    out.update(acceptance(records))
    out["output_lengths"] = output_lengths(records)
    out["errors"] = [r.error for r in records if r.error][:5]
    out["num_errors"] = sum(1 for r in records if r.error)
    return out


_REPEAT = re.compile(r"-r(\d+)-")


def repeat_of(request_id: str) -> int:
    """The repeat a request was sent in (the ``-r<rep>-`` of its id; 0 without one)."""
    m = _REPEAT.search(request_id)
    return int(m.group(1)) if m else 0


def by_run(records: Sequence[Record], *, batch1: bool = False) -> list[dict]:
    """One compact summary per repeat (the ``-r<rep>-`` of the request ids): the spread a pooled summary hides.

    Batch 1: the repeat's busy time is the sum of its latencies; under load, from its first send to its last answer.
    """
    groups: dict[int, list[Record]] = {}
    for r in records:
        groups.setdefault(repeat_of(r.job.request_id), []).append(r)
    out = []
    for rep in sorted(groups):
        recs = groups[rep]
        ends = [(r.trace.latency_s or 0.0) + r.trace.sent_s for r in recs]
        wall = batch1_wall_s(recs) if batch1 else (max(ends) - min(r.trace.sent_s for r in recs)) or 1e-9
        s = summarize([r.trace for r in recs], wall).as_dict()
        out.append({"repeat": rep, "requests": len(recs), "latency_mean_s": s["latency_s"]["mean"],
                    "tpot_mean_s": s["tpot_s"]["mean"], "throughput_tok_s": s["throughput_tok_s"],
                    "goodput_tok_s": s["goodput_tok_s"], "attainment": s["attainment"],
                    "by_class": class_rows([r.trace for r in recs])})  # fmt: skip
    return out


def class_rows(traces: Sequence[RequestTrace]) -> dict[str, dict]:
    """Per SLO class: requests, attainment, mean TTFT and p99 TPOT (what a long prompt's prefill does to the rest)."""
    groups: dict[str, list[RequestTrace]] = {}
    for t in traces:
        groups.setdefault(t.slo_class, []).append(t)
    out = {}
    for name, ts in sorted(groups.items()):
        ttfts = [t.ttft_s for t in ts if t.ok]
        out[name] = {"requests": len(ts), "attained": sum(t.attained for t in ts),
                     "ttft_mean_s": statistics.mean(ttfts) if ttfts else None,
                     "tpot_p99_s": percentile([t.tpot_s for t in ts if t.ok and t.tpot_s is not None], 99)}  # fmt: skip
    return out


def paired_speedup(records: dict[str, list[Record]], config: str, reference: str) -> float | None:
    """Median over jobs of latency(reference) / latency(config), matching runs of the same job and repeat."""
    ref = {r.job.request_id.rsplit("/", 1)[1]: r for r in records.get(reference, [])}
    ratios = []
    for r in records.get(config, []):
        other = ref.get(r.job.request_id.rsplit("/", 1)[1])
        if other and r.trace.latency_s and other.trace.latency_s and r.trace.num_tokens == other.trace.num_tokens:
            ratios.append(other.trace.latency_s / r.trace.latency_s)
    return statistics.median(ratios) if ratios else None


def lossless(records: dict[str, list[Record]], config: str, reference: str) -> dict | None:
    """How many jobs produced exactly the reference configuration's tokens."""
    ref = {r.job.request_id.rsplit("/", 1)[1]: r.token_ids for r in records.get(reference, []) if not r.error}
    pairs = [
        (r.token_ids, ref[key])
        for r in records.get(config, [])
        if not r.error and (key := r.job.request_id.rsplit("/", 1)[1]) in ref
    ]
    if not pairs:
        return None
    return {"equal": sum(a == b for a, b in pairs), "compared": len(pairs)}


def _fmt(x: float | None, spec: str = ".1f", scale: float = 1.0) -> str:
    return "–" if x is None else format(x * scale, spec)


def batch1_table(results: dict) -> Table:
    table = Table(title=f"Batch 1 ({results['workload']['batch1']['num_requests']} prompts × "
                  f"{results['workload']['batch1']['repeats']} repeats, interleaved)")  # fmt: skip
    cols = ("config", "tok/s", "× target-only", "paired ×", "× hf-assisted", "TTFT p50 ms", "TPOT p50 ms",
            "TPOT p99 ms", "accept rate", "tokens/step", "overhead", "lossless")  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c == "config" else "right")
    for name, row in results["batch1"].items():
        s = row["summary"]
        ov = row.get("overhead") or {}
        ll = row.get("lossless_vs_target_only")
        table.add_row(
            name,
            _fmt(s["throughput_tok_s"]),
            _fmt(row.get("speedup_vs_target_only"), ".2f"),
            _fmt(row.get("paired_speedup_vs_target_only"), ".2f"),
            _fmt(row.get("speedup_vs_hf_assisted"), ".2f"),
            _fmt(s["ttft_s"]["p50"], ".0f", 1e3),
            _fmt(s["tpot_s"]["p50"], ".1f", 1e3),
            _fmt(s["tpot_s"]["p99"], ".1f", 1e3),
            _fmt(s["acceptance_rate"], ".2f"),
            _fmt(s["mean_tokens_per_step"], ".2f"),
            _fmt(ov.get("overhead_share"), ".0%") if ov else "–",
            f"{ll['equal']}/{ll['compared']}" if ll else "–",
        )
    return table


def load_table(results: dict, phase: str) -> Table:
    budget = results.get("token_budget") or {}
    b = f"; tree budget B = {budget['value']} ({budget['source']})" if budget.get("value") else ""
    table = Table(title=f"{phase}: SLO classes scaled to baseline TPOT {results['baseline_tpot_ms']:.1f} ms{b}")
    classes = ["stringent", "moderate", "relaxed"]
    if any("long" in row["summary"]["attainment_by_class"] for per in results[phase].values() for row in per.values()):
        classes.append("long")  # long-prompt arrivals (bench.long_prompts)
    cols = ("load", "config", "tok/s", "goodput", "attain", *classes,
            "TTFT p50 ms", "TPOT p50 ms", "latency p99 s", "overhead")  # fmt: skip
    for c in cols:
        table.add_column(c, justify="left" if c in ("load", "config") else "right")
    for load, per_config in results[phase].items():
        for name, row in per_config.items():
            s = row["summary"]
            by = s["attainment_by_class"]
            ov = row.get("overhead") or {}
            table.add_row(
                load,
                name,
                _fmt(s["throughput_tok_s"]),
                _fmt(s["goodput_tok_s"]),
                _fmt(s["attainment"], ".0%"),
                *(_fmt(by.get(c), ".0%") for c in classes),
                _fmt(s["ttft_s"]["p50"], ".0f", 1e3),
                _fmt(s["tpot_s"]["p50"], ".1f", 1e3),
                _fmt(s["latency_s"]["p99"], ".2f"),
                _fmt(ov.get("overhead_share"), ".0%") if ov else "–",
            )
    return table


def print_tables(results: dict, console: Console | None = None) -> None:
    console = console or Console()
    if results.get("batch1"):
        console.print(batch1_table(results))
    for phase in ("sweep", "closed", "mix", "bursty"):
        if results.get(phase):
            console.print(load_table(results, phase))
