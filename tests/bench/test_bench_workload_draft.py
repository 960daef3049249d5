"""Policy benches on another prompt set and draft: `--workload grounded --draft-model suffix:...`
makes every stack of a bench draft with the suffix tree on grounded prompts, the configurations unchanged."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench import harness, harness_cli
from bench.harness import Harness, adaptive_options, run_bench
from bench.options import GROUNDED_MAX_PROMPT_TOKENS, WORKLOADS, BenchOptions
from bench.prompts import GROUNDED
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair

SUFFIX = "suffix:global_tokens=0"  # per-request trees only: configurations sharing a stack cannot feed each other


def test_cli_sets_workload_and_stack_draft(monkeypatch):
    got: list[BenchOptions] = []
    monkeypatch.setattr(harness, "run_bench", lambda opts: got.append(opts) or {})
    args = ["--adaptive", "--pair", "tiny", "--workload", "grounded", "--draft-model", SUFFIX]
    result = CliRunner().invoke(harness_cli.app, args)
    assert result.exit_code == 0, result.output
    (opts,) = got
    assert set(opts.prompt_mix) == set(GROUNDED) and opts.max_prompt_tokens == GROUNDED_MAX_PROMPT_TOKENS
    assert opts.stack_draft == SUFFIX
    # the widened fixed-k baselines of the grounded runs
    assert [c for c in opts.sweep if c.startswith("tandem-k") or c == "target-only"] == [
        "target-only", "tandem-k1", "tandem-k2", "tandem-k3", "tandem-k5", "tandem-k7"]  # fmt: skip


def test_cli_refuses_an_unknown_workload(monkeypatch):
    monkeypatch.setattr(harness, "run_bench", lambda opts: pytest.fail("ran with a bad workload"))
    result = CliRunner().invoke(harness_cli.app, ["--workload", "poetry"])
    assert result.exit_code != 0 and "poetry" in result.output


def test_stack_draft_applies_to_every_tandem_stack_but_own_drafts(tmp_path):
    opts = BenchOptions(batch1=["target-only", "hf-target"], sweep=["tandem-k3", "policy:smartspec", "draft:ngram:k4"],
                        stack_draft=SUFFIX)  # fmt: skip
    h = Harness(opts, tmp_path)
    h.draft_dir = None  # no pair draft prepared: the stack draft still keeps the speculating configurations
    b1, sw = h._configs()
    assert [c.name for c in b1] == ["target-only", "hf-target"] and b1[1].stack is None
    assert b1[0].stack.draft_model == SUFFIX
    drafts = {c.name: c.stack.draft_model for c in sw}
    assert drafts == {"tandem-k3": SUFFIX, "policy:smartspec": SUFFIX, "draft:ngram:k4": "ngram"}
    assert sw[1].stack.speculation_policy == "smartspec"


@pytest.mark.timeout(240)
def test_tiny_adaptive_bench_on_grounded_prompts_with_the_suffix_draft(tmp_path):
    target, draft = save_tiny_pair(tmp_path / "models")
    configs = ["target-only", "tandem-k3", "policy:smartspec"]
    opts = adaptive_options(
        models=Models(target=target, draft=draft, home=tmp_path), sweep=configs, sweep_requests=3,
        sweep_max_new_tokens=6, rates=[40.0], max_prompt_tokens=96, prompt_mix=dict(WORKLOADS["grounded"]),
        stack_draft=SUFFIX, bursty=False,
    )  # fmt: skip
    res = run_bench(opts, tmp_path / "out")
    assert res["models"]["draft"] == SUFFIX
    assert set(res["workload"]["sweep"]["prompt_mix"]) == set(GROUNDED)
    (load,) = res["sweep"]
    for name, row in res["sweep"][load].items():
        s = row["summary"]
        assert s["num_ok"] == s["num_requests"] == 3, (name, s["errors"])
