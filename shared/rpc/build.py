"""Build the generated gRPC/protobuf code: ``python -m shared.rpc.build``.

    python -m shared.rpc.build            # build if any .proto changed
    python -m shared.rpc.build --force    # rebuild

The logic lives in ``shared/rpc/_protoc.py`` (see its docstring for the layout).
Importing ``shared.rpc`` already builds stale code, so without ``--force`` this
mostly reports; it is the explicit step for Makefiles and Dockerfiles.
"""

from __future__ import annotations

import argparse
import sys

from shared.rpc._protoc import GEN_DIR, build, is_up_to_date

__all__ = ["build", "is_up_to_date", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.rpc.build", description="Build the code generated from protos/."
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    built = build(force=args.force)
    print(f"{GEN_DIR}: {'built' if built else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
