#!/usr/bin/env bash
# Creates the git-ignored virtual environment <repo>/.venv with a CPU-only jax and the OpenXLA CPU
# PJRT plugin (`xla-cpu-pjrt`: xla_cpu_pjrt.so and its pjrt_c_api.h) from PyPI. Both are test-only:
# tests/xla/ runs olmax's emitted StableHLO modules on jax's XLA CPU backend, and olmax's own PJRT
# runtime (olmax::pjrt, whose header CMake takes from the wheel) on the plugin.
# Idempotent: an existing .venv with the pinned versions is left as it is.
# Usage: tools/setup_jax_venv.sh            (override the pins with OLMAX_JAX_VERSION=x.y.z, OLMAX_XLA_CPU_PJRT_VERSION=x.y.z)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
python=/usr/bin/python3
jax_version=${OLMAX_JAX_VERSION:-0.10.2}
pjrt_version=${OLMAX_XLA_CPU_PJRT_VERSION:-0.0.1}

fail() { echo "setup_jax_venv: $*" >&2; exit 1; }

[ -x "$python" ] || fail "$python not found (install the Debian package python3)"

if [ -x "$venv/bin/python" ] &&
   "$venv/bin/python" -c "import jax, sys; sys.exit(jax.__version__ != '$jax_version')" 2>/dev/null &&
   "$venv/bin/python" -m pip show xla-cpu-pjrt 2>/dev/null | grep -qx "Version: $pjrt_version"; then
  echo "setup_jax_venv: $venv already has jax $jax_version and xla-cpu-pjrt $pjrt_version"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv" ||
    fail "'$python -m venv $venv' failed (on Debian install python3-venv: apt-get install python3-venv)"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "jax==$jax_version" "jaxlib==$jax_version" "xla-cpu-pjrt==$pjrt_version" ||
  fail "pip install jax==$jax_version jaxlib==$jax_version xla-cpu-pjrt==$pjrt_version into $venv failed (network? Python version too old for this jax?)"
"$venv/bin/python" -c "import jax; print('setup_jax_venv: jax', jax.__version__, 'devices', jax.devices('cpu'))" ||
  fail "jax was installed into $venv but does not import"
