"""The policy goals at a glance: one line per goal, paper and regime, picked from the full table's rows.

The full table (bench.goals_table) holds every run: each policy variant, each re-run with a larger sample,
each machine. The headline answers what each goal asks: is it met on this machine, by which
policy in which run, and where it is not, how close the closest run came. A line is met when some run met
it (by the full table's rule: the pooled value and a majority of the repeats); its value is then that
run's, else the run with the smallest shortfall (how far its pooled value is from the goal).

    rows = goals_table.collect(root, suffix)
    lines = headline(rows)          # [{"paper", "goal", "regime", "met", "row", "rows_met", "rows"}...]
    markdown(lines, link)           # the README's table
"""

from __future__ import annotations

GOALS = (  # (row kind, goal as stated)
    ("adaptive-latency", "mean latency within 5 % of the best fixed k at every load and on the bursty trace"),
    ("adaptive-goodput", "goodput ≥ 1.2× target-only at the lowest load"),
    ("adaserve", "SLO attainment ≥ 1.3× the best baseline where it falls below 70 %"),
    ("laps-sd", "mean latency ≥ 25 % below FCFS at 30 and 50 requests"),
    ("faser-tpot", "pipelining + early exit: batch-1 TPOT ≥ 15 % below serial SD"),
    ("faser-pruning", "early exit measurably pruning (≥ 1 % of drafted tokens at some load)"),
)
REGIMES = ("suffix draft, grounded prompts", "feature draft, open chat")


def regime(row: dict) -> str:
    """Which strong draft a run used: the feature draft's runs are the '<bench>-eagle*' folders."""
    return REGIMES[1] if "-eagle" in row["folder"] else REGIMES[0]


def paper(row: dict) -> str:
    """The paper a row's policy implements (the adaptive goals are three papers' policies side by side)."""
    if row["kind"].startswith("adaptive"):
        name = row["policy"].removeprefix("policy:")
        return "SmartSpec" if name.startswith("smartspec") else "FASER-AD" if name.startswith("faser") else "Nightjar"
    return {"adaserve": "AdaServe", "laps-sd": "LAPS-SD"}.get(row["kind"], "FASER")


def _closeness(row: dict) -> float:
    return float("inf") if row.get("shortfall") is None else row["shortfall"]


def headline(rows: list[dict]) -> list[dict]:
    """One line per (goal, paper, regime) that has rows: met by any run, else the closest run."""
    lines = []
    for kind, goal in GOALS:
        mine = [r for r in rows if r.get("kind") == kind]
        for name in dict.fromkeys(paper(r) for r in mine):
            for where in REGIMES:
                group = [r for r in mine if paper(r) == name and regime(r) == where]
                if not group:
                    continue
                met = [r for r in group if r["met"]]
                best = min(met or group, key=_closeness)
                lines.append({"paper": name, "goal": goal, "regime": where, "met": bool(met), "row": best,
                              "rows_met": len(met), "rows": len(group)})  # fmt: skip
    return lines


def markdown(lines: list[dict], link: str) -> str:
    """The table: ``link`` is the path prefix of the results folders (each run's README holds its command).
    "yes (2 of 9)": 2 of the 9 rows of the full table behind this line (policy variants x runs) met the goal."""
    out = ["| paper | goal | regime | met | measured (the run that met it, else the closest) | spread over repeats "
           "| commit | run |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for line in lines:
        row = line["row"]
        who = "" if line["paper"] == "FASER" else row["policy"]  # FASER's rows compare fixed stacks, not policies
        value = f"`{who}`: {row['value']}" if who else row["value"]
        met = f"**yes** ({line['rows_met']} of {line['rows']})" if line["met"] else f"no (0 of {line['rows']})"
        out.append(f"| {line['paper']} | {line['goal']} | {line['regime']} | {met} | {value} | {row['spread']} "
                   f"| {row['commit']} | [{row['folder']}]({link}/{row['folder']}/README.md) |")
    return "\n".join(out)


# How each goal reads as a number: (threshold, "lower" or "higher" is better, axis label). A row's shortfall is
# its distance from the threshold in the goal's own unit (<= 0: the pooled value meets it).
SCALES = {
    "adaptive-latency": (0.05, "lower", "worst load: latency over the best fixed k"),
    "adaptive-goodput": (1.2, "higher", "goodput / target-only at the lowest load"),
    "adaserve": (1.3, "higher", "SLO attainment / best baseline"),
    "laps-sd": (0.75, "lower", "worst of 30, 50: mean latency / FCFS"),
    "faser-tpot": (0.85, "lower", "batch-1 TPOT / serial SD"),
    "faser-pruning": (0.01, "higher", "share of drafted tokens pruned"),
}


def value(line: dict) -> float | None:
    """The line's number on its goal's scale (None: no reading, e.g. no load where the goal applies)."""
    shortfall = line["row"].get("shortfall")
    if shortfall is None:
        return None
    threshold, better, _ = SCALES[line["row"]["kind"]]
    return threshold + shortfall if better == "lower" else threshold - shortfall


def plot(lines: list[dict], path) -> None:
    """The summary plot: one panel per goal, a bar per paper and regime (green where met), the goal dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [kind for kind, _ in GOALS if any(line["row"]["kind"] == kind for line in lines)]
    cols = min(3, max(len(kinds), 1))
    nrows = -(-max(len(kinds), 1) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[len(kinds):]:
        ax.axis("off")
    for ax, kind in zip(axes.flat, kinds):
        mine = [line for line in lines if line["row"]["kind"] == kind]
        threshold, better, label = SCALES[kind]
        labels = [f"{line['paper']}\n{'feature' if line['regime'] == REGIMES[1] else 'suffix'}" for line in mine]
        ys = [value(line) for line in mine]
        colors = ["tab:green" if line["met"] else "tab:grey" for line in mine]
        ax.bar(range(len(mine)), [y if y is not None else 0.0 for y in ys], color=colors)
        for i, y in enumerate(ys):
            if y is None:
                ax.text(i, 0, "n/a", ha="center", va="bottom", fontsize=7)
        ax.axhline(threshold, ls="--", c="black", lw=1)
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set_title(f"{label}\n(goal {'≤' if better == 'lower' else '≥'} {threshold:g})", fontsize=9)
    fig.suptitle("The policy goals: the run that met each (green) or came closest (grey)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
