#!/usr/bin/env bash
# Fetches a oneDNN 3.x build (Intel's PyPI wheels onednn-cpu-gomp and onednn-devel-cpu-gomp 2023.2.0:
# oneDNN 3.2, GNU OpenMP threading like olmax, no other runtime) into the git-ignored
# third_party_local/onednn-3.2/{include,lib} (pip checks the wheels' hashes), and prints the CMake
# flags that build olmax::onednn against it instead of Debian 12's oneDNN 2.6:
#
#     bash tools/setup_onednn3.sh
#     cmake -S . -B build-onednn3 -DCMAKE_BUILD_TYPE=Release $(bash tools/setup_onednn3.sh --cmake-flags)
#
# Programs built so find the library through their RPATH (CMake's default in a build tree).
# Idempotent: a second run only prints. Needs python3 with venv (Debian: python3-venv) and PyPI;
# exits non-zero without them.
# tools/test.sh uses it to build and run tests/onednn against both API generations.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=2023.2.0
dest="$root/third_party_local/onednn-3.2"
flags="-DOLMAX_ONEDNN_INCLUDE_DIR=$dest/include -DOLMAX_ONEDNN_LIBRARY=$dest/lib/libdnnl.so.3"
if [ ! -f "$dest/lib/libdnnl.so.3" ] || [ ! -f "$dest/include/oneapi/dnnl/dnnl.hpp" ]; then
  # pip from the jax venv (tools/setup_jax_venv.sh) where there is one, else from a venv of its own.
  pip_python="$root/.venv/bin/python"
  if ! "$pip_python" -m pip --version >/dev/null 2>&1; then
    pip_python="$root/third_party_local/pip-venv/bin/python"
    [ -x "$pip_python" ] || python3 -m venv "$root/third_party_local/pip-venv" >&2
  fi
  wheels=$(mktemp -d)
  trap 'rm -rf "$wheels"' EXIT
  "$pip_python" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" \
    "onednn-cpu-gomp==$version" "onednn-devel-cpu-gomp==$version" >&2
  python3 - "$dest" "$wheels" >&2 <<'PY'
import glob, os, shutil, sys, zipfile
dest, wheels = sys.argv[1], sys.argv[2]
tmp = dest + ".partial"
shutil.rmtree(tmp, ignore_errors=True)
for wheel in glob.glob(os.path.join(wheels, "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for entry in z.infolist():
            parts = entry.filename.split("/", 3)  # <name>-<version>.data/data/{lib,include}/...
            if entry.is_dir() or len(parts) < 4 or not parts[0].endswith(".data") or parts[1] != "data" or parts[2] not in ("lib", "include"):
                continue
            target = os.path.join(tmp, parts[2], parts[3])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(entry) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
shutil.rmtree(dest, ignore_errors=True)
os.rename(tmp, dest)
print(f"setup_onednn3: oneDNN 3.2 in {dest}")
PY
fi
if [ "${1:-}" = --cmake-flags ]; then
  echo "$flags"
else
  echo "setup_onednn3: cmake flags: $flags"
fi
