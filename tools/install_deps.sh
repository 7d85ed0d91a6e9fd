#!/usr/bin/env bash
# Installs the Debian packages olmax builds and tests with, only those missing (idempotent: when all
# are installed, apt is not touched). apt-get runs directly as root, through sudo otherwise.
# Then prepares the optional jax virtual environment (tools/setup_jax_venv.sh) used by tests/xla;
# a failure there is a warning, not an error (those tests skip without it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(build-essential cmake libeigen3-dev libxtensor-dev xtl-dev libxsimd-dev catch2 libbenchmark-dev
          python3-numpy python3-matplotlib python3-torch python3-venv
          libgloo-dev  # olmax::distributed (the Gloo communicator) and tests/distributed
          libopenmpi-dev  # olmax::distributed_mpi (the MPI communicator, optional); Open MPI 4.1, brings openmpi-bin (mpirun)
          libdnnl-dev  # olmax::onednn (bf16/fp32 GEMM through oneDNN 2.6, optional): tests/onednn, benchmarks/gemm_bf16
          fortunes)  # fortunes: the default training corpus of examples/train_lm (/usr/share/games/fortunes)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$package")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} Debian packages are installed"
else
  echo "install_deps: installing ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "install_deps: not root and no sudo; install these packages first: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
fi

if [ -f "$root/tools/setup_jax_venv.sh" ]; then
  if ! bash "$root/tools/setup_jax_venv.sh"; then
    echo "install_deps: WARNING: tools/setup_jax_venv.sh failed; tests that need jax (tests/xla) will skip." >&2
  fi
fi
