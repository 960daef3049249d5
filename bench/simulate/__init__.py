"""The simulator: the real Scheduler on a virtual clock, simulated target and draft workers.

    step_costs.py   what a forward costs: a measured profile, a constant, or roofline.py
    acceptance.py   recorded acceptance traces and sampling from them (recorder.py records them)
    workers.py      SimTarget / SimDraft: the worker protocols on the clock, acceptance sampled
    runner.py       the benches' phases and results over a backend (simulated, or the real stack in-process)
    fidelity.py     real vs simulated on the CPU demo pair
    gpu_regime.py   the papers' experiments on an H100 roofline
    cli.py          `tandem simulate` / `python -m bench.simulate`

Data flow: workload (bench.workload, bench.arrivals) -> bench.drivers -> Scheduler (real policies)
-> SimTarget / SimDraft (sleep on FakeClock for StepCosts, sample acceptance) -> bench.report.
"""
