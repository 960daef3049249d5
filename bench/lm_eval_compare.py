"""lm-evaluation-harness as a client of Tandem's HTTP API, against lm-eval's own transformers backend.

    python -m bench.lm_eval_compare --pair demo        (from the repository root; nothing is downloaded)

One stack (`tandem up` with the HTTP port, float32, the pair's draft speculating under the default policy)
serves `local-completions`: loglikelihoods through `echo` + `logprobs` (the prefill's prompt
log-probabilities), generations through greedy completions with stop strings. The same two local tasks
(bench/lm_eval/tasks: a multiple-choice loglikelihood task and a generate_until task, JSONL in the repo)
then run on lm-eval's `hf` backend over the same model directory in float32. Per document: generations
must be identical, loglikelihoods within 1e-3. Results: bench/results/http-demo/lm-eval/.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import httpx
import typer

from bench.harness import machine
from bench.stack import Models
from services.launcher import LaunchConfig, launch

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "bench" / "lm_eval" / "tasks"
TASK_NAMES = ["tandem_capitals", "tandem_completions"]
RESULTS = ROOT / "bench" / "results" / "http-demo" / "lm-eval"
LL_TOLERANCE = 1e-3


def evaluate(model: str, model_args: str, **kw) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    os.chdir(ROOT)  # the tasks' data_files are relative to the repository root
    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=TASK_NAMES, batch_size=1,
                                   task_manager=TaskManager(include_path=str(TASKS)), log_samples=True,
                                   random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0,
                                   **kw)  # fmt: skip


def per_doc(out: dict) -> dict[str, dict[int, list]]:
    """task -> doc_id -> the filtered responses (loglikelihoods per choice, or the generated text)."""
    return {task: {s["doc_id"]: s["filtered_resps"] for s in samples} for task, samples in out["samples"].items()}


def compare(tandem: dict, hf: dict) -> dict:
    a, b = per_doc(tandem), per_doc(hf)
    ll = [abs(float(x[0]) - float(y[0])) for d in a["tandem_capitals"]
          for x, y in zip(a["tandem_capitals"][d], b["tandem_capitals"][d])]  # fmt: skip
    gens = [(a["tandem_completions"][d][0], b["tandem_completions"][d][0]) for d in sorted(a["tandem_completions"])]
    return {
        "loglikelihood_requests": len(ll), "loglikelihood_max_abs_diff": max(ll),
        "loglikelihood_within_tolerance": max(ll) <= LL_TOLERANCE,
        "generations": len(gens), "generations_identical": sum(x == y for x, y in gens),
        "generation_pairs": gens,
        "metrics": {name: {task: {k: v for k, v in out["results"][task].items() if not k.startswith("alias")}
                           for task in TASK_NAMES} for name, out in (("tandem", tandem), ("hf", hf))},
    }  # fmt: skip


def render(meta: dict, c: dict) -> str:
    m = c["metrics"]
    lines = [
        f"# lm-evaluation-harness over Tandem's HTTP API vs lm-eval's transformers backend: {meta['date']}", "",
        f"Command: `{meta['command']}` (from the repository root)  ",
        f"Machine: {meta['machine']}  ", f"Commit: {meta['commit']}  ",
        f"Stack: pair {meta['pair']}, float32, draft speculating under the `{meta['policy']}` policy; "
        "lm-eval `local-completions` (tokenized requests, the model's own tokenizer) against `hf` (float32, CPU)", "",
        "Tasks (bench/lm_eval/tasks, local JSONL): `tandem_capitals` (multiple choice: loglikelihood through "
        "`echo` + `logprobs`), `tandem_completions` (generate_until, greedy, cut at a newline or a full stop).", "",
        "| | Tandem HTTP | lm-eval hf |", "|---|---|---|",
        f"| tandem_capitals acc | {m['tandem']['tandem_capitals']['acc,none']:.3f} | {m['hf']['tandem_capitals']['acc,none']:.3f} |",
        f"| tandem_completions exact_match | {m['tandem']['tandem_completions']['exact_match,none']:.3f} "
        f"| {m['hf']['tandem_completions']['exact_match,none']:.3f} |", "",
        f"Loglikelihoods: {c['loglikelihood_requests']} requests, largest difference "
        f"{c['loglikelihood_max_abs_diff']:.2e} (tolerance {LL_TOLERANCE:g}: "
        f"{'met' if c['loglikelihood_within_tolerance'] else 'NOT met'}).  ",
        f"Generations: {c['generations_identical']} of {c['generations']} identical.", "",
        "| Tandem HTTP | lm-eval hf |", "|---|---|",
        *[f"| {json.dumps(x)} | {json.dumps(y)} |" for x, y in c["generation_pairs"]], "",
    ]  # fmt: skip
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


@app.command()
def main(pair: str = typer.Option("demo"), policy: str = typer.Option("fixed")) -> None:
    import subprocess

    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    target_dir = Models(pair=pair).target_dir()
    config = LaunchConfig(pair=pair, port=0, metrics_port=None, http_port=0, dtype="float32",
                          speculation_policy=policy)  # fmt: skip
    with launch(config) as stack:
        base = stack.endpoints.http_url
        served = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]
        args = (f"model={served},base_url={base}/v1/completions,tokenizer_backend=huggingface,tokenizer={target_dir},"
                "tokenized_requests=True,num_concurrent=1,max_retries=1,timeout=600")  # fmt: skip
        tandem = evaluate("local-completions", args)
    hf = evaluate("hf", f"pretrained={target_dir},dtype=float32", device="cpu")
    c = compare(tandem, hf)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    meta = {"command": "python -m bench.lm_eval_compare " + " ".join(sys.argv[1:]), "pair": pair, "policy": policy,
            "machine": ", ".join(f"{k} {v}" for k, v in machine(2).items() if k in ("platform", "cpu_count", "torch")),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit.strip()}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lm_eval.json").write_text(json.dumps(meta | c, indent=2) + "\n")
    (RESULTS / "README.md").write_text(render(meta, c))
    print((RESULTS / "README.md").read_text())
    if not (c["loglikelihood_within_tolerance"] and c["generations_identical"] == c["generations"]):
        raise SystemExit(1)


if __name__ == "__main__":
    app()
