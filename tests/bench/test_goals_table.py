"""bench.goals_table: each goal checked on the current run of its bench in each regime."""

from __future__ import annotations

import json

import pytest

from bench.goals_table import _commit, _met, results_of


def test_results_of_reads_only_the_current_folder_of_each_bench_and_regime(tmp_path):
    for name, run in (("adaptive-g", {"command": "current"}), ("adaptive-g-high", {"command": "an older rerun"}),
                      ("order-g", {"command": "order"})):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(run))
    results, folder = results_of(tmp_path, "adaptive", "g")
    assert folder.name == "adaptive-g" and results["command"] == "current"
    results, folder = results_of(tmp_path, "order", "g")
    assert folder.name == "order-g" and results["command"] == "order"
    assert results_of(tmp_path, "slo", "g") is None


def test_a_rewritten_run_is_credited_to_the_commit_it_lands_in_not_the_previous_runs(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    run = tmp_path / "adaptive-g"
    run.mkdir()
    (run / "results.json").write_text("{}")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first run")
    first = subprocess.run(["git", "log", "-1", "--format=%h"], cwd=tmp_path, capture_output=True, text=True)
    assert _commit(run) == first.stdout.strip()
    (run / "results.json").write_text('{"rerun": true}')  # the table is regenerated before the rerun is committed
    assert _commit(run) == "this commit"


def test_a_goal_needs_the_pooled_value_and_most_repeats():
    assert _met(True, [True, True, False]) and not _met(True, [True, False, False]) and not _met(False, [True] * 3)
    assert _met(True, [])  # repeats unknown: the pooled value decides


def test_adaserve_goal_rows_per_variant_against_every_baseline(tmp_path):
    from bench.goals_table import adaserve

    def cell(attained: float, runs: list[float]) -> dict:
        return {"summary": {"attainment": attained}, "by_run": [{"attainment": a} for a in runs]}

    results = {"command": "slo", "sweep": {
        "rate=1": {"tandem-k3": cell(0.8, [0.8] * 3), "policy:adaserve": cell(0.9, [0.9] * 3)},  # baseline >= 70 %
        "rate=2": {"tandem-k3": cell(0.5, [0.5] * 3), "policy:global_greedy:marginal": cell(0.6, [0.6] * 3),
                   "policy:adaserve": cell(0.5, [0.4, 0.5, 0.6]), "policy:adaserve:marginal": cell(0.8, [0.8] * 3)},
    }}  # fmt: skip
    rows = adaserve(results, tmp_path, draft=" (feature draft)")
    assert [r["goal"].split(":")[0] for r in rows] == ["policy", "policy"]
    plain, marginal = rows
    assert "policy:adaserve: SLO" in plain["goal"] and plain["goal"].endswith("(feature draft)")
    # the best baseline at rate=2 is the priced GlobalGreedy (0.6), not the chain
    assert plain["value"] == "rate=2: 0.83x policy:global_greedy:marginal" and not plain["met"]
    assert marginal["value"] == "rate=2: 1.33x policy:global_greedy:marginal" and marginal["met"]


def test_order_goal_reads_the_feature_draft_run_beside_the_suffix_one(tmp_path):
    from bench.goals_table import collect

    def cell(mean: float, runs: list[float]) -> dict:
        return {"summary": {"latency_s": {"mean": mean}}, "latency_mean_by_run_s": runs}

    def order(ratio: float) -> dict:
        return {"command": "order", "closed": {f"concurrency={n}": {
            "order:fcfs": cell(10.0, [10.0] * 3), "order:laps-sd:est=1": cell(10 * ratio, [10 * ratio] * 3)}
            for n in (30, 50)}}  # fmt: skip

    for name, run in (("order-grounded", order(0.8)), ("order-eagle", order(0.7))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(run))
    rows = collect(tmp_path, "grounded")
    assert [(r["folder"], r["met"]) for r in rows] == [("order-grounded", False), ("order-eagle", True)]
    assert rows[1]["goal"].endswith("(feature draft, open chat)") and rows[1]["value"] == "30: -30%; 50: -30%"


def test_order_goal_names_what_a_clairvoyant_order_reaches_on_the_sample(tmp_path):
    from bench.goals_table import laps

    def rows(order):  # 8 requests, FCFS ran them longest first; 4 slots
        return [{"id": f"order:fcfs/closed0-r0-i{i}", "max_new_tokens": s, "tokens": s, "steps": s,
                 "ttft_s": 0.1 * i, "latency_s": 1.0} for i, s in enumerate(order)]  # fmt: skip

    fcfs = {"summary": {"latency_s": {"mean": 10.0}}, "latency_mean_by_run_s": [10.0],
            "requests": rows([80, 70, 60, 50, 4, 3, 2, 1])}  # fmt: skip
    est = {"summary": {"latency_s": {"mean": 8.0}}, "latency_mean_by_run_s": [8.0]}
    results = {"command": "order", "closed": {"concurrency=30": {"order:fcfs": fcfs, "order:laps-sd:est=1": est}}}
    (row,) = laps(results, tmp_path)
    # FCFS replay: ends 80 70 60 50 54 57 59 60 -> 61.25; SJF: 1 2 3 4 51 62 73 84 -> 35 (0.57)
    assert row["value"] == "30: -20% (shortest-first knowing every request's rounds, replayed on this sample: -42.9%)"


def test_the_readme_section_is_rewritten_between_its_markers(tmp_path):
    import typer

    from bench.goals_table import README_BEGIN, README_END, readme_section, rewrite_readme

    rows = [{"paper": "LAPS-SD", "goal": "g", "value": "30: -20%", "spread": "-21% .. -19%", "met": False,
             "commit": "abc1234", "folder": "order-eagle", "command": "python -m bench.harness --order",
             "kind": "laps-sd", "policy": "order:laps-sd", "shortfall": 0.05}]  # fmt: skip
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\n\nbefore\n{README_BEGIN}\nold table\n{README_END}\nafter\n")
    section = readme_section(rows, tmp_path / "bench" / "results" / "goals", readme)
    rewrite_readme(readme, section)
    text = readme.read_text()
    assert text.startswith("# T\n\nbefore\n" + README_BEGIN) and text.endswith(README_END + "\nafter\n")
    assert "old table" not in text and "0 of 1 goal lines met" in text and "(0 of 1 met:" in text
    assert ("| LAPS-SD | mean latency ≥ 25 % below FCFS at 30 and 50 requests | feature draft, open chat | no (0 of 1) "
            "| `order:laps-sd`: 30: -20% | -21% .. -19% | abc1234 | [order-eagle](bench/results/order-eagle/README.md) |") in text
    assert "(bench/results/goals/summary.png)" in text
    rewrite_readme(readme, section)
    assert readme.read_text() == text  # idempotent
    readme.write_text("# no markers\n")
    with pytest.raises(typer.BadParameter):
        rewrite_readme(readme, section)


def test_calibration_treats_each_fixed_k_as_a_policy_against_the_other_fixed_ones():
    from bench.goals_table import fixed_calibration

    def cell(mean, runs):
        return {"summary": {"latency_s": {"mean": mean}}, "latency_mean_by_run_s": runs}

    # k1 and k2 trade the best place (noise); k3 is 20 % slower everywhere; a policy is not a fixed configuration
    results = {"sweep": {
        "rate=1": {"tandem-k1": cell(1.00, [1.0, 1.0, 1.0]), "tandem-k2": cell(1.08, [1.1, 1.1, 1.04]),
                   "tandem-k3": cell(1.2, [1.2] * 3), "policy:smartspec": cell(1.0, [1.0] * 3)},
        "rate=2": {"tandem-k1": cell(1.08, [1.1, 1.04, 1.1]), "tandem-k2": cell(1.00, [1.0] * 3),
                   "tandem-k3": cell(1.2, [1.2] * 3), "policy:smartspec": cell(1.0, [1.0] * 3)},
    }}  # fmt: skip
    passing, tried = fixed_calibration(results)
    assert tried == 3 and passing == []  # each of k1, k2 is 8 % behind the other at one load
    results["sweep"]["rate=2"]["tandem-k1"] = cell(1.03, [1.04, 1.02, 1.03])
    assert fixed_calibration(results) == (["tandem-k1"], 3)


def test_repeat_noise_is_the_median_per_repeat_misreading_of_fixed_pairs():
    from bench.goals_table import repeat_noise

    def cell(runs):
        return {"summary": {"latency_s": {"mean": sum(runs) / len(runs)}}, "latency_mean_by_run_s": runs}

    # k1/k2 pooled 1.0; per repeat 1.1, 0.9, 1.0 -> deviations 10 %, 10 %, 0 %; policies do not count
    results = {"sweep": {"rate=1": {"tandem-k1": cell([1.1, 0.9, 1.0]), "tandem-k2": cell([1.0, 1.0, 1.0]),
                                    "policy:faser": cell([5.0, 0.1, 1.0])}}}  # fmt: skip
    assert repeat_noise(results) == pytest.approx(0.10)
    results["sweep"]["rate=1"]["tandem-k1"] = cell([1.0, 1.0, 1.0])
    assert repeat_noise(results) == pytest.approx(0.0)
    assert repeat_noise({"sweep": {}}) is None


def test_reruns_beside_the_current_folder_add_no_rows(tmp_path):
    from bench.goals_table import collect

    def cell(mean: float, runs: list[float], tpot: float = 0.02) -> dict:
        summary = {"latency_s": {"mean": mean}, "tpot_s": {"mean": tpot}, "goodput_tok_s": 1 / tpot}
        return {"summary": summary, "latency_mean_by_run_s": runs}

    def adaptive(policy_mean: float, runs: list[float]) -> dict:
        load = {"target-only": cell(2.0, [2.0] * 3, 0.06), "tandem-k7": cell(1.0, [1.0] * 3),
                "policy:smartspec-request": cell(policy_mean, runs)}  # fmt: skip
        return {"command": "adaptive", "sweep": {"rate=0.2": load}, "bursty": {}}

    for name, run in (("adaptive-grounded", adaptive(1.08, [1.08] * 3)),
                      ("adaptive-grounded-16", adaptive(1.03, [1.01, 1.06, 1.02])),
                      ("adaptive-eagle", adaptive(1.02, [1.02] * 3)),
                      ("adaptive-eagle-5rep", adaptive(1.07, [1.07] * 5))):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(run))
    latency = [r for r in collect(tmp_path, "grounded") if "mean latency" in r["goal"]]
    assert [(r["folder"], r["met"]) for r in latency] == [("adaptive-grounded", False), ("adaptive-eagle", True)]
    assert latency[1]["goal"].endswith("(feature draft, open chat)")


def test_early_exit_pruning_is_read_at_every_load(tmp_path):
    from bench.goals_table import faser

    def cfg(tpot, pruned, proposed=1000):
        ee = {"proposed": proposed, "pruned": pruned, "pruned_share": pruned / proposed}
        return {"summary": {"tpot_s": {"mean": tpot}}, "by_run": [{"tpot_mean_s": tpot}] * 3, "early_exit": ee}

    b1 = {"faser:serial": cfg(0.1, 0), "faser:pipe": cfg(0.09, 0), "faser:ee": cfg(0.1, 0), "faser:all": cfg(0.09, 0)}
    shut = faser({"batch1": b1, "command": "c"}, tmp_path)
    assert [r["met"] for r in shut] == [False, False]  # the gate stayed shut at batch 1: nothing pruned
    loaded = {"rate=1.6": {"faser:ee": cfg(0.2, 30), "faser:all": cfg(0.2, 12)}}
    rows = faser({"batch1": b1, "sweep": loaded, "command": "c"}, tmp_path)
    assert rows[1]["met"] and "rate=1.6: faser:ee 3.0% of 1000" in rows[1]["value"]
    loaded["rate=1.6"]["faser:all"] = cfg(0.2, 5)  # 0.5 %: not measurable
    assert not faser({"batch1": b1, "sweep": loaded, "command": "c"}, tmp_path)[1]["met"]


def test_the_headline_keeps_one_line_per_goal_paper_and_regime_met_by_any_run_else_the_closest():
    from bench.goals_headline import headline

    def row(policy, folder, met, shortfall, kind="adaptive-latency"):
        return {"kind": kind, "policy": policy, "folder": folder, "met": met, "shortfall": shortfall, "value": policy,
                "spread": "–", "commit": "c", "paper": "p", "goal": "g"}  # fmt: skip

    rows = [row("policy:smartspec", "adaptive-eagle", False, 0.02), row("policy:smartspec-request", "adaptive-eagle-5rep", True, -0.01),
            row("policy:smartspec", "adaptive-grounded", False, 0.10), row("policy:nightjar", "adaptive-eagle", False, 0.09),
            row("policy:nightjar-lean", "adaptive-eagle-5rep", False, 0.07),
            row("policy:adaserve", "slo-eagle", False, None, kind="adaserve"),
            row("policy:adaserve:triage", "slo-eagle", False, 0.2, kind="adaserve")]  # fmt: skip
    lines = {(x["paper"], x["regime"]): x for x in headline(rows)}
    assert set(lines) == {("SmartSpec", "feature draft, open chat"), ("SmartSpec", "suffix draft, grounded prompts"),
                          ("Nightjar", "feature draft, open chat"), ("AdaServe", "feature draft, open chat")}  # fmt: skip
    smart = lines["SmartSpec", "feature draft, open chat"]
    assert smart["met"] and smart["row"]["policy"] == "policy:smartspec-request" and (smart["rows_met"], smart["rows"]) == (1, 2)
    night = lines["Nightjar", "feature draft, open chat"]
    assert not night["met"] and night["row"]["policy"] == "policy:nightjar-lean"  # the closest: smallest shortfall
    assert lines["AdaServe", "feature draft, open chat"]["row"]["policy"] == "policy:adaserve:triage"  # None: no reading


def test_the_summary_plot_reads_each_line_on_its_goals_scale(tmp_path):
    from bench.goals_headline import headline, plot, value

    def row(kind, folder, met, shortfall, policy="p"):
        return {"kind": kind, "policy": policy, "folder": folder, "met": met, "shortfall": shortfall}

    lines = headline([row("laps-sd", "order-eagle", True, -0.03, "order:laps-sd"),
                      row("adaptive-goodput", "adaptive-grounded", True, -0.3, "policy:nightjar"),
                      row("adaserve", "slo-eagle", False, None, "policy:adaserve")])  # fmt: skip
    assert [value(x) for x in lines] == [pytest.approx(1.5), None, pytest.approx(0.72)]  # goals order: adaptive first
    plot(lines, tmp_path / "summary.png")
    assert (tmp_path / "summary.png").stat().st_size > 10_000
