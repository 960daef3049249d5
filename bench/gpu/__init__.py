"""The GPU kit: validate and measure Tandem on a borrowed GPU with prepared commands (docs/gpu.md).

    here         make gpu-kit     kit.py      wheels + demo GGUF cut into loads under .gpu-kit/, the calls printed
    GPU machine  stage            kit.py      one call per load but the last: copy it into the staging directory
                 make gpu-check   check.py    setup (install offline, protos, models), GPU tests -> $OUT
                 make gpu-bench   bench.py    timed stages: verify-cost curve and B, decode tok/s, SM split,
                                              bench-faser, bench-slo -> $OUT
    here         unpack           results.py  $OUT's files into bench/results/gpu-<run>-<device>/

kit, check, bench, budget and results use the standard library only at import (they run before
the wheels are installed); the stage modules (device, warm, verify_curve, decode, sm_split,
serving) run as subprocesses with the installed wheels on PYTHONPATH.
"""
