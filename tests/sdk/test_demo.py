"""The demo's workload mix and report (the demo itself runs the SmolLM2 pair: `make demo`)."""

from rich.console import Console

from sdk.client import AcceptanceStats, FinishReason, GenerateResult
import json
from pathlib import Path

from sdk.demo import DEMO_DRAFT, SLO_CLASSES, SPECULATION, DemoDraft, demo_draft, report, workload

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "demo-drafts" / "results.json"


def test_workload_mixes_slo_classes_and_speculation_modes():
    requests = workload(12, base_tpot_ms=50.0, max_new_tokens=64)
    assert len(requests) == 12
    assert {r.slo_class for r in requests} == {name for name, _ in SLO_CLASSES}
    assert {r.speculation for r in requests} == set(SPECULATION)
    assert {r.slo_tpot_ms for r in requests} == {100.0, 200.0, 400.0, None}
    assert all(48 <= r.max_new_tokens <= 64 for r in requests)


def test_report_renders_results_errors_and_totals():
    requests = workload(3, base_tpot_ms=50.0, max_new_tokens=16)
    ok = GenerateResult(
        request_id="a", token_ids=[1, 2, 3], text="hi", finish_reason=FinishReason.EOS, ttft_ms=12.0, tpot_ms=40.0,
        slo_attained=True,
        stats=AcceptanceStats(num_steps=2, num_draft_tokens=4, num_accepted_tokens=2, mean_accepted_length=2.0),
    )  # fmt: skip
    missed = ok.model_copy(update={"request_id": "b", "slo_attained": False})
    console = Console(record=True, width=120)
    report(console, requests, [ok, missed, RuntimeError("boom")], wall_s=2.0, base_tpot_ms=50.0, draft="my-draft")
    text = console.export_text()
    assert "my-draft" in text
    assert "2 of 3 finished" in text and "boom" in text
    assert "SLO attainment" in text and "1/2 (50%)" in text
    assert "mean accepted length" in text


def test_the_demo_serves_the_draft_with_the_highest_measured_accepted_length():
    measured = json.loads(RESULTS.read_text())
    k = max(r["k"] for r in measured["rows"])
    at_k = {r["draft"]: r for r in measured["rows"] if r["k"] == k}
    best = max(at_k.values(), key=lambda r: r["mean_accepted_length"])
    assert measured["best"] == best["draft"]
    assert DEMO_DRAFT.label.split()[0] == best["draft"]
    assert (DEMO_DRAFT.pair, DEMO_DRAFT.draft_model) == (best["pair"], best["draft_model"])
    assert {"smollm2-draft", "smollm2-eagle3", "ngram", "suffix"} <= set(at_k)  # every draft prepared offline


def test_the_command_line_can_name_another_pair_or_draft():
    assert demo_draft(None, None) == DEMO_DRAFT
    assert demo_draft("demo", None) == DemoDraft(label="smollm2-draft", pair="demo")
    assert demo_draft(None, "suffix") == DemoDraft(label="suffix", pair=DEMO_DRAFT.pair, draft_model="suffix")
