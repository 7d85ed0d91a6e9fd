#!/usr/bin/env bash
# Creates the git-ignored virtual environment <repo>/.venv-torch with PyTorch 2.x from PyPI, for the
# benchmarks that compare olmax with a current PyTorch (benchmarks/quality/, benchmarks/ssm/,
# benchmarks/train_step/). Benchmark-only: CI and the test suite never call this.
#
# PyPI's default `torch` wheel for Linux x86_64 is the CUDA build (about 2.8 GB of downloads with its
# nvidia-* dependencies); it runs on the CPU, which is all these benchmarks use.
# Idempotent: an existing .venv-torch whose torch imports is left as it is.
# Usage: benchmarks/quality/setup_torch_venv.sh      (pin a version with OLMAX_TORCH_VERSION=2.x.y)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="${OLMAX_TORCH_VENV:-$root/.venv-torch}"
python=/usr/bin/python3
spec="torch${OLMAX_TORCH_VERSION:+==$OLMAX_TORCH_VERSION}"

fail() { echo "setup_torch_venv: $*" >&2; exit 1; }
[ -x "$python" ] || fail "$python not found (install the Debian package python3)"

if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, sys; v = '${OLMAX_TORCH_VERSION:-}'; sys.exit(bool(v) and torch.__version__.split('+')[0] != v)" 2>/dev/null; then
  echo "setup_torch_venv: $venv already has torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" || fail "'$python -m venv $venv' failed (on Debian: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off "$spec" numpy ||
  fail "pip install $spec numpy into $venv failed (network? disk space: the CUDA wheel needs about 6 GB unpacked)"
"$venv/bin/python" -c "import torch; print('setup_torch_venv: torch', torch.__version__, 'threads', torch.get_num_threads())" ||
  fail "torch was installed into $venv but does not import"
