#!/usr/bin/env bash
# Creates the git-ignored virtual environment <repo>/.venv with a CPU-only jax from PyPI. It is a
# test-only oracle: tests/xla/ runs olmax's emitted StableHLO modules on jax's XLA CPU backend.
# Idempotent: an existing .venv with the pinned jax is left as it is.
# Usage: tools/setup_jax_venv.sh            (override the pin with OLMAX_JAX_VERSION=x.y.z)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
python=/usr/bin/python3
jax_version=${OLMAX_JAX_VERSION:-0.10.2}

fail() { echo "setup_jax_venv: $*" >&2; exit 1; }

[ -x "$python" ] || fail "$python not found (install the Debian package python3)"

if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$jax_version')" 2>/dev/null; then
  echo "setup_jax_venv: $venv already has jax $jax_version"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" ||
    fail "'$python -m venv $venv' failed (on Debian install python3-venv: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "jax==$jax_version" "jaxlib==$jax_version" ||
  fail "pip install jax==$jax_version jaxlib==$jax_version into $venv failed (network? Python version too old for this jax?)"
"$venv/bin/python" -c "import jax; print('setup_jax_venv: jax', jax.__version__, 'devices', jax.devices('cpu'))" ||
  fail "jax was installed into $venv but does not import"
