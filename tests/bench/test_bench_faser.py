"""`make bench-faser`'s configurations and preset (never run here: only the mapping to stacks and options)."""

from __future__ import annotations

import pytest

from bench.configs import FASER_DRAFT_SHARE, FASER_FRONTIER, FASER_K, StackKey, parse, parse_list
from bench.harness import FASER_SWEEP, faser_options


def test_faser_variants_map_to_stack_settings():
    configs = {c.name: c for c in parse_list(list(FASER_SWEEP))}
    expected = {"faser:serial": ("off", "off"), "faser:pipe": (FASER_FRONTIER, "off"),
                "faser:ee": ("off", "on"), "faser:all": (FASER_FRONTIER, "on")}  # fmt: skip
    for name, (frontier, early_exit) in expected.items():
        c = configs[name]
        assert c.is_tandem and c.speculation == FASER_K  # the same chain length everywhere
        assert c.stack == StackKey("fixed:4", "fcfs", frontier, early_exit, FASER_DRAFT_SHARE)
    assert len({c.stack for c in configs.values()}) == 4  # a stack each
    # the settings the stacks pass on parse as the services parse them
    from services.settings import ServiceSettings

    for c in configs.values():
        ServiceSettings(frontier=c.stack.frontier, early_exit=c.stack.early_exit)


def test_other_configs_leave_the_environment_alone():
    assert parse("tandem-k3").stack.frontier is None and parse("tandem-k3").stack.early_exit is None
    assert parse("order:las").stack.draft_share is None


@pytest.mark.parametrize("name", ["faser:", "faser:fast", "faser"])
def test_unknown_faser_variant(name):
    with pytest.raises(ValueError):
        parse(name)


def test_faser_preset():
    opts = faser_options()
    assert opts.name == "faser" and opts.batch1 == list(FASER_SWEEP) == opts.sweep
    assert opts.rate_factors == [0.5, 4.0] and opts.concurrency == []


def test_faser_flag_presets_what_the_command_line_does_not_give(monkeypatch):
    from typer.testing import CliRunner

    import bench.harness as harness
    import bench.harness_cli as harness_cli

    got = []
    monkeypatch.setattr(harness, "run_bench", lambda opts: got.append(opts) or {})
    result = CliRunner().invoke(harness_cli.app, ["--faser", "--pair", "tiny", "--rate-factors", "1"])
    assert result.exit_code == 0, result.output
    (opts,) = got
    assert opts.name == "faser" and opts.sweep == list(FASER_SWEEP) and opts.batch1 == list(FASER_SWEEP)
    assert opts.rate_factors == [1.0]  # given: kept
    assert opts.models.pair == "tiny"


def test_bench_stack_passes_the_settings_on(monkeypatch, tmp_path):
    import os

    import bench.stack as stack_mod
    from bench.stack import Models, bench_stack

    seen = {}

    class Launched:
        endpoints = None

        def stop(self):
            pass

    def fake_start(config):
        seen["config"] = config
        seen["env"] = {k: config.extra_env.get(k) for k in ("TANDEM_FRONTIER", "TANDEM_EARLY_EXIT")}
        seen["process_env"] = os.environ.get("TANDEM_FRONTIER")
        return Launched()

    monkeypatch.setattr(stack_mod, "start", fake_start)
    monkeypatch.delenv("TANDEM_FRONTIER", raising=False)
    with bench_stack(Models(pair="tiny"), parse("faser:all").stack, tmp_path, traces=False):
        pass
    assert seen["config"].draft_share == FASER_DRAFT_SHARE
    assert seen["env"] == {"TANDEM_FRONTIER": FASER_FRONTIER, "TANDEM_EARLY_EXIT": "on"}
    assert seen["process_env"] is None  # the children's settings, never this process's (stacks start from threads)
    assert "TANDEM_FRONTIER" not in os.environ


def test_faser_runs_profile_at_the_split_thread_counts_too(tmp_path, monkeypatch):
    """Each FASER stack runs its target and draft on one of two cores: the run profiles at 1 thread as well."""
    from bench.harness import Harness
    from bench.options import BenchOptions
    from shared.profiling import sm_share

    monkeypatch.setattr(sm_share, "available_cores", lambda: 2)
    assert Harness(faser_options(), tmp_path)._split_threads() == (None, 1)
    monkeypatch.setattr(sm_share, "available_cores", lambda: 8)
    assert Harness(faser_options(), tmp_path)._split_threads() == (None, 4)
    assert Harness(BenchOptions(name="x", batch1=["tandem-k3"], sweep=[]), tmp_path)._split_threads() == (None,)
