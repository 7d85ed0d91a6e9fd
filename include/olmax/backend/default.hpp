#pragma once
// The host's default kernels: `backend::default_backend` names the static backend that
// `host_kernels()` (registry.hpp) uses until `set_host_kernels` or a `host_kernels_scope` says
// otherwise. Changing the process's default means changing this alias, nothing else.

#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_openmp.hpp"

namespace olmax::backend {

/// The static backend behind the host's default kernels.
using default_backend = cpu_openmp;

static_assert(Backend<default_backend>, "olmax: the default backend must model olmax::backend::Backend");

}  // namespace olmax::backend
