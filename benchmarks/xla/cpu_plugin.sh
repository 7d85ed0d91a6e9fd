# Sourced by the XLA benchmark scripts after build_folder.sh (`source "$here/cpu_plugin.sh" NAME`):
# sets `plugin` to $PLUGIN or, by default, the xla-cpu-pjrt wheel's plugin in <repo>/.venv; exits
# naming NAME and how to get one when there is none (under the callers' set -e and pipefail too:
# the failing ls must not end the script silently).
plugin="${PLUGIN:-$(ls "$repo"/.venv/lib/python3*/site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so 2>/dev/null | head -1 || true)}"
[ -n "$plugin" ] || { echo "$1: no CPU plugin; run tools/setup_jax_venv.sh or set PLUGIN" >&2; exit 1; }
