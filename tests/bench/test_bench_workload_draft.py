"""Policy benches on another prompt set and draft: `--workload grounded --draft-model suffix:...`
makes every stack of a bench draft with the suffix tree on grounded prompts, the configurations unchanged.
A real run of it: tests/bench/test_bench_adaptive.py (the adaptive preset, run in that form)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bench import harness, harness_cli
from bench.harness import Harness
from bench.options import GROUNDED_MAX_PROMPT_TOKENS, BenchOptions
from bench.prompts import GROUNDED

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
