#pragma once
// The default backend choice, `backend::default_backend`, with the concept it must model.
//
// Code above the backend layer that needs a backend without being a template on one (autodiff's
// gradient accumulation and data-parallel shards) names `backend::default_backend` through this
// header and never includes a concrete backend, so it runs on whatever the default is and the
// layering check (tests/layering) can tell "uses the default" from "depends on cpu_openmp".
// The alias itself is declared next to the backend it names (cpu_openmp.hpp); changing the default
// means changing that alias and the include below, nothing in autodiff.

#include "olmax/backend/concept.hpp"
#include "olmax/backend/cpu_openmp.hpp"

namespace olmax::backend {

static_assert(Backend<default_backend>, "olmax: the default backend must model olmax::backend::Backend");

}  // namespace olmax::backend
