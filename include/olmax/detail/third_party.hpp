#pragma once
// The one place where olmax includes Eigen and xtensor. A dependency that moves its headers
// (xtensor >= 0.26 moved everything under xtensor/containers, xtensor/views, ...) or bumps its
// major version (Eigen 3.4 -> 5) needs an edit here only.

#include <Eigen/Core>

#if __has_include(<xtensor/containers/xadapt.hpp>)  // xtensor >= 0.26 layout
#include <xtensor/containers/xadapt.hpp>
#include <xtensor/containers/xstorage.hpp>
#include <xtensor/io/xnpy.hpp>
#else  // xtensor 0.24 / 0.25 flat layout
#include <xtensor/xadapt.hpp>
#include <xtensor/xnpy.hpp>
#include <xtensor/xstorage.hpp>
#endif

#include <xsimd/memory/xsimd_aligned_allocator.hpp>

#if defined(_OPENMP)
#include <omp.h>
#endif
