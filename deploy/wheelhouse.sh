#!/usr/bin/env bash
# Fills deploy/wheelhouse/ with every wheel an image build needs, on a machine with an index, so that
# deploy/Dockerfile then builds with no network at all (pip --no-index --find-links /wheels).
#
#   deploy/wheelhouse.sh cpu        CPU torch (from pip's configured index), Tandem's dependencies, arize-phoenix
#   deploy/wheelhouse.sh gpu        CUDA torch (TORCH_INDEX_URL: the PyTorch index of your CUDA version),
#                                   Tandem's dependencies, flashinfer-python and ninja
#
# PYTHON_VERSIONS: the image's Python (default 3.11: Debian bookworm, python:3.11-slim; 3.12 for Ubuntu
# 24.04 CUDA images). Wheels only (--only-binary): nothing is
# compiled on the way in.
set -euo pipefail
variant=${1:-cpu}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
dest=${WHEELHOUSE:-$here/wheelhouse}
read -ra pys <<<"${PYTHON_VERSIONS:-3.11}"
torch=${TORCH_VERSION:-2.13.0}
deps=$(python3 - "$root/pyproject.toml" <<'PY'
import sys, tomllib
print("\n".join(d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] if not d.startswith("torch")))
PY
)
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform linux_x86_64 --platform any)
download() {
    for py in "${pys[@]}"; do
        python3 -m pip download -q -d "$dest" --python-version "$py" --only-binary=:all: "${platforms[@]}" "$@"
    done
}
mkdir -p "$dest"
# pip download judges python_full_version markers by the running Python, not --python-version: what
# an older micro version needs is named here (redis: async-timeout below Python 3.11.3, Debian's 3.11.2)
micro_markers=("async-timeout>=4.0.3")
mapfile -t reqs <<<"$deps"
case $variant in
  cpu)
    download "torch==$torch" "setuptools>=68" wheel "${reqs[@]}" "${micro_markers[@]}"
    download "arize-phoenix==${PHOENIX_VERSION:-20.26.1}" ;;
  gpu)
    download ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==$torch" "setuptools>=68" wheel \
        "${reqs[@]}" "${micro_markers[@]}" flashinfer-python ninja ;;
  *) echo "usage: $0 cpu|gpu" >&2; exit 2 ;;
esac
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
