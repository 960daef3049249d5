#!/usr/bin/env bash
# Fills deploy/wheelhouse/ with every wheel an image build needs, on a machine with an index, so that
# deploy/Dockerfile then builds with no network at all (pip --no-index --find-links /wheels).
#
#   deploy/wheelhouse.sh cpu        CPU torch (from pip's configured index), Tandem's dependencies, arize-phoenix
#   deploy/wheelhouse.sh gpu        CUDA torch (TORCH_INDEX_URL: the PyTorch index of your CUDA version),
#                                   Tandem's dependencies, flashinfer-python and ninja
#
# PYTHON_VERSION (default 3.11) must be the image's Python: 3.11 for python:3.11-slim and Debian bookworm,
# 3.12 for Ubuntu 24.04 CUDA images. Wheels only (--only-binary): nothing is compiled on the way in.
set -euo pipefail
variant=${1:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dest=${WHEELHOUSE:-$here/wheelhouse}
py=${PYTHON_VERSION:-3.11}
torch=${TORCH_VERSION:-2.13.0}
deps=$(python3 - "$root/pyproject.toml" <<'PY'
import sys, tomllib
print("\n".join(d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] if not d.startswith("torch")))
PY
)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform linux_x86_64 --platform any)
download() { python3 -m pip download -q -d "$dest" --python-version "$py" --only-binary=:all: "${platforms[@]}" "$@"; }
mkdir -p "$dest"
mapfile -t reqs <<<"$deps"
case $variant in
  cpu)
    download "torch==$torch" "setuptools>=68" wheel "${reqs[@]}"
    download "arize-phoenix==${PHOENIX_VERSION:-20.26.1}" ;;
  gpu)
    download ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==$torch" "setuptools>=68" wheel \
        "${reqs[@]}" flashinfer-python ninja ;;
  *) echo "usage: $0 cpu|gpu" >&2; exit 2 ;;
esac
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
