"""`make bench-order` in miniature on the tiny pair: queue policies side by side, N requests at once."""

from __future__ import annotations

import json

import pytest

from bench.configs import StackKey, parse
from bench.harness import ORDER_SWEEP, order_options, run_bench
from bench.order import order_summary, write
from bench.stack import Models
from tests.support.tiny_stack import save_tiny_pair


def test_order_configs_get_a_stack_per_queue_policy():
    c = parse("order:laps-sd")
    assert c.is_tandem and c.speculation == 3 and c.stack == StackKey("fixed:4", "laps-sd")
    with pytest.raises(ValueError):
        parse("order:")


def test_order_preset():
    opts = order_options()
    assert opts.sweep == list(ORDER_SWEEP) and opts.batch1 == [] and opts.rate_factors == []
    assert opts.concurrency == [10, 30, 50] and opts.sweep_max_new_tokens == (8, 256)
    assert opts.closed_factor == 1 and opts.length_dist == "log-uniform"  # N requests at once, a heavy tail


def test_order_flag_presets_what_the_command_line_does_not_give(monkeypatch):
    from typer.testing import CliRunner

    import bench.harness as harness
    import bench.harness_cli as harness_cli

    got = []
    monkeypatch.setattr(harness, "run_bench", lambda opts: got.append(opts) or {})
    monkeypatch.setattr("bench.order.write", lambda *a, **k: None)
    monkeypatch.delenv("TANDEM_MAX_BATCH_SIZE", raising=False)
    result = CliRunner().invoke(harness_cli.app, ["--order", "--pair", "tiny", "--concurrency", "2,4"])
    assert result.exit_code == 0, result.output
    (opts,) = got
    assert opts.concurrency == [2, 4] and opts.sweep == list(ORDER_SWEEP) and opts.name == "order"
    import os

    assert os.environ.pop("TANDEM_MAX_BATCH_SIZE") == "4"


SMOKE = ["order:fcfs", "order:laps-sd:est=1"]  # two stacks keep it short; every policy runs in e2e tests


@pytest.mark.timeout(240)
def test_tiny_bench_order_runs_policies_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_MAX_BATCH_SIZE", "2")
    target, draft = save_tiny_pair(tmp_path / "models")
    opts = order_options(
        models=Models(target=target, draft=draft, home=tmp_path), concurrency=[4], sweep_requests=4,
        sweep_max_new_tokens=(2, 16), max_prompt_tokens=48, traces=False, sweep=SMOKE,
    )  # fmt: skip
    out = tmp_path / "out"
    res = run_bench(opts, out)
    (load,) = res["closed"]
    assert load == "concurrency=4" and set(res["closed"][load]) == set(SMOKE)
    for name, row in res["closed"][load].items():
        s = row["summary"]
        assert s["num_ok"] == s["num_requests"] == 4, (name, s["errors"])
        assert 2 <= s["output_lengths"]["mean_tokens"] <= 16
        rows = row["requests"]  # per request: enough to replay the order
        assert len(rows) == 4 and all(r["tokens"] <= r["max_new_tokens"] and r["ttft_s"] <= r["latency_s"] for r in rows)
    summary = write(res, out)
    assert summary[load]["order:fcfs"]["mean_vs_fcfs"] == pytest.approx(1.0)
    assert json.loads((out / "order_summary.json").read_text()) == summary
    assert (out / "order_latency.png").stat().st_size > 1000
    assert order_summary(res) == summary


class _Raw:
    """An encoder that returns the work items as drawn: the sample, without a tokenizer."""

    @staticmethod
    def encode_all(items):
        return items


def _sample(h, **kw) -> list[tuple[str, int]]:
    return [(it.prompt.text, it.max_new_tokens) for it in h._items(30, None, (8, 256), **kw)]


def test_each_closed_load_and_repeat_draws_its_own_sample(tmp_path):
    from bench.harness import Harness

    h = Harness(order_options(models=Models(home=tmp_path), prompt_mix={"chat": 1.0}), tmp_path)
    h.encoder = _Raw()
    # a closed pass's sample: its own per (load, repeat) offset, the same again for the next configuration
    first = _sample(h, seed_offset=100, own_sample=True)
    assert first == _sample(h, seed_offset=100, own_sample=True)
    assert first != _sample(h, seed_offset=150, own_sample=True)  # the next repeat
    assert first != _sample(h, seed_offset=101, own_sample=True)  # the next load
    # phases that share the run's prompts (the sweep: only the arrivals differ) ignore the offset
    assert _sample(h, seed_offset=1) == _sample(h, seed_offset=2)


def _sent_samples(tmp_path, **opts):
    """(phase, repeat, configuration) -> the prompts the sweep and the bursty trace sent, through a stub sender."""
    import asyncio
    import types

    from bench.configs import parse
    from bench.harness import Harness, adaptive_options

    h = Harness(adaptive_options(models=Models(home=tmp_path), prompt_mix={"chat": 1.0}, sweep_requests=6,
                                 sweep_repeats=3, rates=[1.0, 2.0], **opts), tmp_path)  # fmt: skip
    h.baseline_tpot_ms = 50.0
    h.encoder = types.SimpleNamespace(encode_all=lambda items: [types.SimpleNamespace(item=it, index=i)
                                                                for i, it in enumerate(items)])  # fmt: skip
    sent = {}

    async def send(phase, load, config, jobs, *_):
        rep = int(jobs[0].request_id.split("-r")[1].split("-")[0])
        sent[(phase, load, rep, config.name)] = [j.encoded.item.prompt.text for j in jobs]
        return types.SimpleNamespace(wall_s=0.0)

    h._send = send
    configs = [parse("target-only"), parse("tandem-k3")]
    asyncio.run(h._sweep(configs, {}, {}))
    asyncio.run(h._bursty(configs, {}, {}))
    return sent


def test_a_prompt_sample_per_sweep_repeat_when_asked(tmp_path):
    for per_repeat in (False, True):
        sent = _sent_samples(tmp_path, sample_per_repeat=per_repeat)
        loads = {(phase, load) for phase, load, _, _ in sent}
        assert len(loads) == 3  # two rates and the bursty trace
        for phase, load in loads:
            by_rep = []
            for rep in range(3):  # within a repeat every configuration gets the same prompts
                same = sent[(phase, load, rep, "target-only")]
                assert same == sent[(phase, load, rep, "tandem-k3")]
                by_rep.append(same)
            distinct = len({tuple(s) for s in by_rep})
            assert distinct == (3 if per_repeat else 1), (phase, load, per_repeat)
