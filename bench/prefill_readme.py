"""README.md of `python -m bench.prefill`'s results (bench/results/serving-demo/prefill/), from results.json.

    python -m bench.prefill_readme [results.json]      # rewrites README.md beside it
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

GOALS = {"p99": 3.0, "ttft": 1.3, "later_turns": 3.0}


def _verdict(values: list[float], ok) -> str:
    met = sum(1 for v in values if ok(v))
    return f"met in {met} of {len(values)} repeats" if met * 2 > len(values) else f"not met ({met} of {len(values)} repeats)"


def readme(results: dict) -> str:
    run, args = results["run"], results["args"]
    spec = "off: `--spec-k 0`" if not args["spec_k"] else f"chains of {args['spec_k']}"
    lines = ["# serving-demo / prefill: chunked prefill and automatic prefix caching", "",
             f"Command: `{run['command']}`  ", f"Machine: {run['machine']}; load: {run.get('load', 'not recorded')}  ",
             f"Date: {run['date']}; duration {run['duration_s']} s; commit {run['commit']}  ",
             "Models: ~/.cache/tandem/models/smollm2-135m-instruct (target; scheduler loop over in-process engines, "
             f"speculation {spec})", ""]  # fmt: skip
    if "tpot" in results:
        t = results["tpot"]
        lines += [f"## p99 TPOT of 4 running requests while {args['long_tokens']:,}-token prompts arrive "
                  f"(every {args['every_s']:g} s, {args['num_long']} per run)", "",
                  "Inter-token gaps of the 4 decoding requests that overlap the window from the first long arrival to the "
                  "last long prompt's first token; TTFT of the long prompts. Chunked: "
                  f"`TANDEM_PREFILL_CHUNK={args['chunk']}`, equal-cost chunks in the step's one target forward beside "
                  "the decoding requests; one-piece: chunking off. Configurations interleaved in every repeat.", "",
                  "| repeat | config | p99 gap (s) | mean gap (s) | TTFT long prompts (s) |", "|---|---|---|---|---|"]  # fmt: skip
        for rep in range(len(t["runs"]["chunked"])):
            for name in ("chunked", "one-piece"):
                r = t["runs"][name][rep]
                lines.append(f"| {rep} | {name} | {r['p99_tpot_s']:.2f} | {r['mean_gap_s']:.3f} | "
                             f"{', '.join(f'{x:.2f}' for x in r['ttft_s'])} |")  # fmt: skip
        p99, ttft = t["p99_tpot_ratio_one_piece_over_chunked"], t["ttft_ratio_chunked_over_one_piece"]
        lines += ["", f"p99 TPOT one-piece / chunked per repeat: {', '.join(f'{x:.2f}' for x in p99)} "
                  f"(goal >= {GOALS['p99']:g}: {_verdict(p99, lambda v: v >= GOALS['p99'])})  ",
                  f"mean long-prompt TTFT chunked / one-piece per repeat: {', '.join(f'{x:.2f}' for x in ttft)} "
                  f"(goal <= {GOALS['ttft']:g}: {_verdict(ttft, lambda v: v <= GOALS['ttft'])})", ""]  # fmt: skip
    for workload, c in results.get("cache", {}).items():
        lines += [f"## {workload}: TTFT per turn, prefix cache on vs off", "",
                  "| repeat | config | TTFT per turn (ms) |", "|---|---|---|"]  # fmt: skip
        for rep in range(len(c["runs"]["cache"])):
            for name in ("cache", "no-cache"):
                lines.append(f"| {rep} | {name} | {', '.join(f'{x * 1e3:.0f}' for x in c['runs'][name][rep])} |")
        later = c["later_turn_ttft_ratio_no_cache_over_cache"]
        lines += ["", f"mean TTFT of turns 2.. no-cache / cache per repeat: {', '.join(f'{x:.2f}' for x in later)} "
                  f"(goal >= {GOALS['later_turns']:g}: {_verdict(later, lambda v: v >= GOALS['later_turns'])})  ",
                  f"target prefix-cache hit rate (tokens) per repeat: {', '.join(f'{x:.3f}' for x in c['target_hit_rate'])}",
                  ""]  # fmt: skip
    return "\n".join(lines)


def load_now() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) at the end"


def main(argv: list[str] | None = None) -> None:
    path = Path((argv or sys.argv[1:] or [str(Path(__file__).parent / "results/serving-demo/prefill/results.json")])[0])
    path.with_name("README.md").write_text(readme(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
