"""`make bench-offload`: configurations, preset, pool sizing, summary, and one real run of the preset on the tiny pair."""

from __future__ import annotations

import json
import os

import pytest

from bench import offload
from bench.configs import OFFLOAD_POLICY, OFFLOAD_SPEC, StackKey, parse
from bench.harness import OFFLOAD_SWEEP, offload_options, run_bench
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("offload-models"))


def test_offload_configs_differ_only_in_the_trigger():
    on, off = parse("offload:on"), parse("offload:off")
    assert on.speculation == off.speculation == "auto"
    assert on.stack == StackKey(OFFLOAD_POLICY, "fcfs", draft_offload=OFFLOAD_SPEC)
    assert off.stack == StackKey(OFFLOAD_POLICY, "fcfs", draft_offload="off")
    assert parse("offload:on:nightjar").stack.speculation_policy == "nightjar"
    assert parse("tandem-k3").stack.draft_offload is None  # other stacks leave the environment's setting
    from services.scheduler.main import draft_memory_config

    assert draft_memory_config(OFFLOAD_SPEC) is not None  # parses as the scheduler parses it
    for bad in ("offload:", "offload:maybe"):
        with pytest.raises(ValueError):
            parse(bad)


def test_pool_is_small_and_grows_by_the_drafts_footprint(tiny):
    target, draft = tiny
    env = offload.pool_env(target, draft, "float32")
    blocks = int(env["TANDEM_NUM_BLOCKS"])
    budget = blocks * offload.BLOCK_SIZE - offload.MAX_BATCH_SIZE * (offload.BLOCK_SIZE + offload.SPARE_K)
    assert budget // (offload.MAX_PROMPT_TOKENS + offload.MAX_NEW_TOKENS) == offload.BASE_REQUESTS
    # the tiny draft: ~100k fp32 parameters + its own pool, in blocks of the target (2 layers, 2 KV heads of 16)
    target_block = 2 * 2 * offload.BLOCK_SIZE * 2 * 16 * 4
    expected = (offload._num_params(draft) * 4 + blocks * target_block // 2) // target_block
    assert int(env["TANDEM_KV_GROW_BLOCKS"]) == expected > blocks
    assert offload.pool_env(target, None, "float32")["TANDEM_KV_GROW_BLOCKS"] == "0"  # no draft, nothing to grow into


def test_preset_and_flag(monkeypatch, tiny):
    from typer.testing import CliRunner

    import bench.harness as harness
    import bench.harness_cli as harness_cli

    opts = offload_options()
    assert opts.sweep == list(OFFLOAD_SWEEP) and opts.batch1 == [] and opts.rate_factors == []
    assert opts.concurrency == [4, 12] and opts.timeline and opts.max_prompt_tokens == offload.MAX_PROMPT_TOKENS
    got, written = [], []
    monkeypatch.setattr(harness, "run_bench", lambda opts: got.append(opts) or {})
    monkeypatch.setattr(offload, "write", lambda results, out, pool: written.append(pool))
    for var in ("TANDEM_NUM_BLOCKS", "TANDEM_KV_GROW_BLOCKS", "TANDEM_BLOCK_SIZE", "TANDEM_MAX_BATCH_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TANDEM_NUM_BLOCKS", "80")  # given: kept
    args = ["--offload", "--target", str(tiny[0]), "--draft", str(tiny[1]), "--concurrency", "6"]
    result = CliRunner().invoke(harness_cli.app, args)
    assert result.exit_code == 0, result.output
    (opts,) = got
    assert opts.name == "offload" and opts.sweep == list(OFFLOAD_SWEEP) and opts.concurrency == [6]
    assert written == [{**offload.pool_env(tiny[0], tiny[1], "float32"), "TANDEM_NUM_BLOCKS": "80"}]
    assert os.environ["TANDEM_MAX_BATCH_SIZE"] == str(offload.MAX_BATCH_SIZE)


def test_summary_of_synthetic_results():
    def row(tok_s, events, budgets):
        timeline = [{"t_s": i, "kv_token_budget": b, "draft_offloaded": (b or 0) > 672, "running": 1, "waiting": 0}
                    for i, b in enumerate(budgets)]  # fmt: skip
        return {"summary": {"throughput_tok_s": tok_s, "latency_s": {"mean": 1.0, "p99": 2.0}, "num_ok": 4},
                "memory_events": events, "timeline": timeline}  # fmt: skip

    results = {"closed": {"concurrency=8": {
        "offload:on": row(300.0, {"offload": 1, "reload": 1, "grow": 1, "shrink": 1}, [None, 672, 2000, 2000]),
        "offload:off": row(200.0, {}, [672, 672]),
    }}}  # fmt: skip
    summary = offload.offload_summary(results)["loads"]["concurrency=8"]
    assert summary["throughput_on_vs_off"] == 1.5
    on = summary["configs"]["offload:on"]
    assert (on["offloads"], on["reloads"], on["pool_events"]) == (1, 1, {"grow": 1, "shrink": 1})
    assert on["kv_token_budget"] == {"min": 672, "max": 2000} and on["share_offloaded"] == 0.5


def test_preset_on_the_tiny_pair(tiny, tmp_path, monkeypatch):
    """The preset for real, smaller: two stacks, the draft offloads and the budget grows on one only."""
    for var, value in offload.pool_env(*tiny, "float32").items():
        monkeypatch.setenv(var, value)
    opts = offload_options(models=Models(target=tiny[0], draft=tiny[1]), concurrency=[8], sweep_requests=12,
                           traces=False)  # fmt: skip
    results = run_bench(opts, tmp_path)
    summary = offload.write(results, tmp_path, pool={})
    rows = summary["loads"]["concurrency=8"]["configs"]
    on, off = rows["offload:on"], rows["offload:off"]
    assert on["num_ok"] == off["num_ok"] == 16  # closed loop: at least 2 x concurrency requests
    assert on["offloads"] >= 1 and on["pool_events"].get("grow", 0) >= 1
    assert on["kv_token_budget"]["max"] > off["kv_token_budget"]["max"] == off["kv_token_budget"]["min"]
    assert off["offloads"] == 0 and not off["pool_events"]
    saved = json.loads((tmp_path / "offload_summary.json").read_text())
    assert saved["loads"].keys() == summary["loads"].keys()
    assert (tmp_path / "offload.png").stat().st_size > 1000
