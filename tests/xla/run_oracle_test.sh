#!/usr/bin/env bash
# CTest driver of the StableHLO-vs-XLA-CPU oracle: dump olmax's modules + CPU reference outputs,
# then execute them with jax's XLA CPU backend. Exit 77 (skipped) when the jax venv is missing.
# Usage: run_oracle_test.sh <xla_oracle_dump executable> <python with jax> <run_xla_oracle.py> <work folder>
set -euo pipefail
dump=$1 python=$2 runner=$3 work=$4
if [ ! -x "$python" ]; then
  echo "SKIP: $python not found; create it with tools/setup_jax_venv.sh (pip install jax into <repo>/.venv)"
  exit 77
fi
rm -rf "$work"
"$dump" "$work"
exec "$python" "$runner" "$work"
