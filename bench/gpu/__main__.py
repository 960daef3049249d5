"""`python -m bench.gpu COMMAND`: the GPU kit's entry points (module docstring of bench/gpu/__init__.py).

    here                                              on the GPU machine (python3, device calls)
    build [--headroom-mib N]   make gpu-kit            stage     stage the carried load
    plan                       the calls, re-checked   check     make gpu-check
    unpack DIR...              results into the repo   bench     make gpu-bench [--stages a,b]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

USAGE = "usage: python -m bench.gpu {build,plan,stage,check,bench,unpack} [options]"


def _build(argv: list[str]) -> int:
    import argparse

    from bench.gpu import kit

    parser = argparse.ArgumentParser(prog="python -m bench.gpu build")
    parser.add_argument("--headroom-mib", type=float, default=kit.DEFAULT_HEADROOM_BYTES / kit.MIB,
                        help="room left in each call for the working tree to grow")  # fmt: skip
    parser.add_argument("--no-download", action="store_true", help="use the wheels already in .gpu-kit/wheels")
    args = parser.parse_args(argv)
    plan = kit.build(headroom=int(args.headroom_mib * kit.MIB), download=not args.no_download)
    print(kit.format_plan(plan))
    return 0


def _plan(argv: list[str]) -> int:
    from bench.gpu import kit

    try:
        plan = kit.load_plan()
    except FileNotFoundError:
        print("no kit: run `make gpu-kit` first", file=sys.stderr)
        return 1
    print(kit.format_plan(plan))
    problems = kit.check_plan(plan, kit.tree_bytes())
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


def _stage(argv: list[str]) -> int:
    from bench.gpu import kit

    try:
        status = kit.stage()
    except kit.KitError as exc:
        print(f"stage failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(status))
    if status["missing"]:
        print(f"still to stage: {', '.join(status['missing'])}; next call carries .gpu-kit/{status['missing'][0]}")
    else:
        print("every load is staged: next, the check call (python3 -m bench.gpu check)")
    return 0


def _unpack(argv: list[str]) -> int:
    from bench.gpu import results

    if not argv:
        print("usage: python -m bench.gpu unpack FILES_AT_DIR...", file=sys.stderr)
        return 2
    done = results.unpack([Path(a) for a in argv])
    return 0 if done else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "check":
        from bench.gpu import check

        return check.main(rest)
    if command == "bench":
        from bench.gpu import bench

        return bench.main(rest)
    handlers = {"build": _build, "plan": _plan, "stage": _stage, "unpack": _unpack}
    if command not in handlers:
        print(USAGE, file=sys.stderr)
        return 2
    return handlers[command](rest)


if __name__ == "__main__":
    sys.exit(main())
