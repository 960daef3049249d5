#!/bin/sh
# Installs into /opt/venv inside an image build (deploy/Dockerfile). Sources, in order: /build when it
# holds wheels (offline: --no-index), else $INDEX_URL / $EXTRA_INDEX_URL (build arguments), else pip's default.
#   sh pip-install.sh deps PIN...      Tandem's dependencies from /build/pyproject.toml, plus PIN...
#   sh pip-install.sh project PIN...   the project itself (editable, /app), gRPC code generated
#   sh pip-install.sh packages SPEC... just these packages
set -eu
mode=$1; shift
[ -x /opt/venv/bin/python ] || python3 -m venv /opt/venv
PY=/opt/venv/bin/python
set -- --no-cache-dir --disable-pip-version-check "$@"
if ls /build/*.whl >/dev/null 2>&1; then
    src="--no-index --find-links /build"
else
    src="${INDEX_URL:+--index-url $INDEX_URL} ${EXTRA_INDEX_URL:+--extra-index-url $EXTRA_INDEX_URL}"
fi
# shellcheck disable=SC2086
case $mode in
  deps)
    $PY -m pip install -q $src "setuptools>=68" wheel
    # the dependency list, read without installing the (not yet copied) project
    $PY - <<'PYEOF' > /tmp/requirements.txt
import tomllib
for dep in tomllib.load(open("/build/pyproject.toml", "rb"))["project"]["dependencies"]:
    print(dep)
PYEOF
    # the pins win over pyproject's ranges: pip keeps the chosen torch build
    $PY -m pip install -q $src -r /tmp/requirements.txt "$@" ;;
  project)
    $PY -m pip install -q --no-deps --no-build-isolation -e /app
    $PY -m pip check
    cd /app && $PY -m shared.rpc.build
    $PY -c "import torch, shared.rpc, services.scheduler.main; print('torch', torch.__version__, 'cuda', torch.version.cuda)" ;;
  packages)
    $PY -m pip install -q $src "$@" ;;
esac
