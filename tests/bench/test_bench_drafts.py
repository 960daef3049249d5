"""`make bench-drafts` end to end on the tiny pair: the feature draft, ngram and suffix side by side with
target-only, interleaved, per task kind and repeat, every configuration lossless.

One workload here, the grounded one (several task kinds, so the per-kind split has something to split): each
workload is the same harness run on its own prompt mix (the chat one differs in bench.options.WORKLOADS only),
and each starts its three stacks (feature draft, ngram, suffix) anew, most of this test's time."""

from __future__ import annotations

import json

from rich.console import Console

from bench import drafts
from bench.configs import parse
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


def test_drafts_preset_on_the_tiny_pair(tmp_path):
    from shared.models.tiny import save_tiny_eagle

    target, draft = save_tiny_pair(tmp_path / "models")
    head = save_tiny_eagle(tmp_path / "models" / "head", target, draft_vocab_size=256)
    results = drafts.run(Models(target=target, draft=draft), str(head), name="drafts-tiny", prompts=2, repeats=2,
                         max_new_tokens=8, closed_requests=4, workloads=["grounded"],
                         console=Console(quiet=True), root=tmp_path / "results", max_prompt_tokens=64)
    names = drafts.configs(str(head))
    assert names[0] == "target-only" and len(names) == 1 + len(drafts.FEATURE_KS) + 2
    assert set(results) == {"grounded"} and set(drafts.WORKLOADS) == {"chat", "grounded"}
    for phase in ("batch1", "closed"):
        table = results["grounded"][phase]["all"]
        assert set(table) == set(names), phase
        for name, s in table.items():
            assert s["repeats"] == 2 and s["requests"] > 0 and s["tok_s"] > 0, (phase, name)
        assert table["target-only"]["ratio"] == 1.0
    kinds = set(results["grounded"]["batch1"]) - {"all"}
    assert kinds and kinds <= {"summarize", "rewrite", "qa", "agent"}
    out = tmp_path / "results" / "drafts-tiny"
    saved = json.loads((out / "drafts.json").read_text())
    readme = (out / "README.md").read_text()
    assert saved["feature_draft"] == str(head) and "## grounded, batch 1" in readme
    assert all(f"| {kind} |" in readme for kind in kinds | {"all"})
    raw = json.loads((out / "grounded" / "results.json").read_text())
    for name, row in raw["batch1"].items():  # greedy: every draft's tokens equal target-only's
        if name != "target-only":
            assert row["lossless_vs_target_only"]["equal"] == row["lossless_vs_target_only"]["compared"], name


def test_draft_configurations_parse():
    c = parse("draft:suffix:max_depth=8:k3")
    assert c.speculation == 3 and c.stack.draft_model == "suffix:max_depth=8"
    assert parse("draft:ngram:k4").stack.draft_model == "ngram"
    tree = parse("draft:smollm2-eagle3@specinfer:1-2-1-1")  # a fixed tree from the stack's policy
    assert tree.speculation == "auto" and tree.stack.draft_model == "smollm2-eagle3"
    assert tree.stack.speculation_policy == "specinfer:1-2-1-1"
    for bad in ("draft::k4", "draft:ngram", "draft:ngram:k0", "draft:@fixed:3", "draft:suffix@"):
        try:
            parse(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
