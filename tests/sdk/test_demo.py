"""The demo's workload mix and report (the demo itself runs the SmolLM2 pair: `make demo`)."""

from rich.console import Console

from sdk.client import AcceptanceStats, FinishReason, GenerateResult
from sdk.demo import SLO_CLASSES, SPECULATION, report, workload


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
    report(console, requests, [ok, missed, RuntimeError("boom")], wall_s=2.0, base_tpot_ms=50.0)
    text = console.export_text()
    assert "2 of 3 finished" in text and "boom" in text
    assert "SLO attainment" in text and "1/2 (50%)" in text
    assert "mean accepted length" in text
