"""Long-prompt arrivals in the SLO benchmark, chunked prefill on vs off per stack (bench.long_prompts, chunk:<N|off>:<c>)."""

from __future__ import annotations

import pytest

from bench import prefill_chunk_report, prom
from bench.configs import parse
from bench.long_prompts import LONG, long_items
from bench.tokens import PromptEncoder


def test_chunk_configurations_set_the_stacks_prefill_chunk_and_keep_the_rest():
    off, on, plain = parse("chunk:off:policy:adaserve"), parse("chunk:256:policy:adaserve"), parse("policy:adaserve")
    assert off.stack.prefill_chunk == 0 and on.stack.prefill_chunk == 256 and plain.stack.prefill_chunk is None
    assert off.speculation == on.speculation == plain.speculation == "auto"
    assert off.stack.speculation_policy == plain.stack.speculation_policy == "adaserve"
    assert len({off.stack, on.stack, plain.stack}) == 3  # a stack each
    assert parse("chunk:off:tandem-k3").speculation == 3 and parse("chunk:off:target-only").speculation == "off"
    for bad in ("chunk:0:tandem-k3", "chunk:x:tandem-k3", "chunk:off:", "chunk:off:hf-target", "chunk:off:nope"):
        with pytest.raises(ValueError):
            parse(bad)


def test_long_items_arrive_evenly_in_the_window_and_encode_to_exactly_the_asked_tokens():
    items = long_items(3, tokens=500, window_s=6.0, first_index=10, max_new_tokens=8, seed=1)
    assert [it.index for it in items] == [10, 11, 12]
    assert [it.arrival_s for it in items] == pytest.approx([1.0, 3.0, 5.0])
    assert {it.slo for it in items} == {LONG} and {it.max_new_tokens for it in items} == {8}
    encoder = PromptEncoder(None, 1000, 500)  # byte-folded: one token per UTF-8 byte, the end kept
    assert {len(e.prompt_ids) for e in encoder.encode_all(items)} == {500}
    assert long_items(3, tokens=500, window_s=6.0, first_index=10, max_new_tokens=8, seed=1) == items
    assert long_items(0, tokens=500, window_s=6.0, first_index=0, max_new_tokens=8) == []
    with pytest.raises(ValueError):
        long_items(1, tokens=0, window_s=1.0, first_index=0, max_new_tokens=8)


def test_prefill_chunks_is_the_schedulers_counter_delta():
    before = prom.parse("tandem_prefill_chunks_total 3.0\n")
    after = prom.parse("tandem_prefill_chunks_total 10.0\n")
    assert prom.prefill_chunks(after - before) == 7 and prom.prefill_chunks(prom.Scrape()) == 0


def _run(attained_others: int, long_ttft: float) -> dict:
    return {"repeat": 0, "attainment": (attained_others + 1) / 5,
            "by_class": {"stringent": {"requests": 2, "attained": min(2, attained_others), "ttft_mean_s": 0.1, "tpot_p99_s": 0.2},
                         "relaxed": {"requests": 2, "attained": max(0, attained_others - 2), "ttft_mean_s": 0.1, "tpot_p99_s": 0.4},
                         "long": {"requests": 1, "attained": 1, "ttft_mean_s": long_ttft, "tpot_p99_s": 0.1}}}  # fmt: skip


def test_the_report_pairs_chunked_and_one_piece_runs_of_each_configuration():
    assert prefill_chunk_report.pairs(["chunk:512:a", "chunk:off:a", "chunk:off:b", "c"]) == [("a", "chunk:512:a", "chunk:off:a")]
    results = {"sweep": {"rate=1": {"chunk:512:a": {"by_run": [_run(4, 3.0)]}, "chunk:off:a": {"by_run": [_run(1, 2.0)]}}}}
    (row,) = prefill_chunk_report.rows(results)
    assert row["config"] == "a" and row["load"] == "rate=1"
    assert row["chunked"][0] == {"attainment": 1.0, "attainment_others": 1.0, "tpot_p99_others_s": 0.4, "long_ttft_mean_s": 3.0}
    assert row["one_piece"][0]["attainment_others"] == 0.25
    lines = prefill_chunk_report.section(results)
    assert lines[1] == "## Chunked vs one-piece prefill" and "| rate=1 | a | 1.00 \\| 0.40 |" in lines[-1]
    assert prefill_chunk_report.section({"sweep": {}}) == []


@pytest.mark.timeout(240)
def test_tiny_slo_run_with_long_prompts_chunks_only_on_the_chunked_stack(tmp_path):
    from bench.harness import run_bench, slo_options
    from bench.stack import Models
    from tests.support.tiny_stack import save_tiny_pair

    target, draft = save_tiny_pair(tmp_path / "models")
    configs = ["chunk:16:tandem-k3", "chunk:off:tandem-k3"]
    opts = slo_options(models=Models(target=target, draft=draft, home=tmp_path), sweep=configs, sweep_requests=2,
                       sweep_max_new_tokens=6, rates=[20.0], stringent_shares=[], max_prompt_tokens=24,
                       long_prompts=1, long_prompt_tokens=80, traces=False, interleave=True)  # fmt: skip
    out = tmp_path / "out"
    res = run_bench(opts, out)

    (load,) = res["sweep"]
    rows = res["sweep"][load]
    for name in configs:
        s = rows[name]["summary"]
        assert s["num_ok"] == s["num_requests"] == 3, (name, s["errors"])  # 2 Poisson arrivals + 1 long prompt
        assert set(s["attainment_by_class"]) >= {"long"}
    assert rows["chunk:16:tandem-k3"].get("prefill_chunks", 0) >= 80 // 16  # the long prompt ran in chunks
    assert "prefill_chunks" not in rows["chunk:off:tandem-k3"]  # one piece
    assert "## Chunked vs one-piece prefill" in (out / "README.md").read_text()
    assert res["commit"]


def test_a_run_records_its_commit_and_the_readme_names_it():
    from bench import results_readme
    from bench.run_info import git_commit

    commit = git_commit()
    assert commit is None or len(commit.removesuffix("+dirty")) >= 7
    text = results_readme.render({"name": "x", "commit": "abc1234", "started_unix": 0, "duration_s": 1})
    assert "commit abc1234" in text.splitlines()[4]
