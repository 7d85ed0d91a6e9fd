#pragma once
// The strategy table of the scan engine: which kernel family runs each strategy tag on each kind
// of geometry, forward and backward, and the one selection that both passes go through.
//
// Kernel families (each a struct with a `name` and static `forward` / `backward`):
//   sequential_vectorized_family   sequential_vectorized.hpp   in place; gates per channel
//   two_pass_family                two_pass.hpp                in place; gates per channel
//   hillis_steele_chunked_family   hillis_steele_chunked.hpp   in place; [B, T, C], gates per channel
//   shared_gate_matmul_family      shared_gate_matmul.hpp      in place; gates shared by heads; forward only
//   tile_family<Kernel>            tile.hpp                    tile engine with one tile kernel; any geometry
//
// A geometry is in one of three classes: gates per channel with the channels adjacent in memory
// ([B, T, C]: contiguous_lanes), gates per channel with the steps adjacent ([B, C, T]), or gates
// shared by heads of channels (either layout). With gates per channel the table has one entry per
// class for both passes: the backward is the same scan run on the reversed adjoint, so it uses the
// forward's family by construction. With shared gates the forward and the backward are separate
// entries (tile_route says why they differ); tests/unit/test_scan.cpp pins every entry.

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "olmax/core/bfloat16.hpp"
#include "olmax/scan/detail/hillis_steele_chunked.hpp"
#include "olmax/scan/detail/problem.hpp"
#include "olmax/scan/detail/sequential_vectorized.hpp"
#include "olmax/scan/detail/shared_gate_matmul.hpp"
#include "olmax/scan/detail/tile.hpp"
#include "olmax/scan/detail/two_pass.hpp"
#include "olmax/scan/strategies.hpp"

namespace olmax::scan::detail {

/// The default row: the strategy's tile kernel on every geometry, except the shared-gate backward.
///   contiguous       gates per channel, [B, T, C]; forward and backward
///   strided          gates per channel, [B, C, T]; forward and backward
///   shared_forward   gates shared by heads; forward
///   shared_backward  gates shared by heads; backward
template <class Kernel>
struct tile_route {
    using contiguous = tile_family<Kernel>;
    using strided = tile_family<Kernel>;
    using shared_forward = tile_family<Kernel>;
    // Gates shared by heads: every strategy's backward is the adjoint scan on the tile engine with
    // the sequential kernel, whatever its forward. The adjoint and the gate gradient are per
    // channel (scan.hpp sums da over each head afterwards), so sharing saves the backward nothing;
    // the sequential kernel is the tile engine's linear-work kernel (the tree kernels do O(T log T)
    // or 2T combines, the per-channel matmul 2Q flops per element, log space a log and exps per
    // element, for the same recurrence and the same exact gradient up to rounding); and the
    // shared-gate GEMM, chunked_matmul's forward here, has no backward form.
    using shared_backward = tile_family<tile_sequential>;
};

/// The table: one row per strategy tag (strategies.hpp). A strategy is a type with a row.
template <class S>
struct route;

template <>
struct route<sequential> : tile_route<tile_sequential> {};
template <>
struct route<sequential_fp64> : tile_route<tile_sequential> {};
template <>
struct route<sequential_vectorized> : tile_route<tile_sequential> {
    using contiguous = sequential_vectorized_family;
    using strided = sequential_vectorized_family;
};
template <>
struct route<two_pass> : tile_route<tile_sequential> {
    using contiguous = two_pass_family;
    using strided = two_pass_family;
};
template <>
struct route<hillis_steele> : tile_route<tile_hillis_steele> {};
template <std::size_t K>
struct route<hillis_steele_chunked<K>> : tile_route<tile_hillis_steele_chunked> {
    using contiguous = hillis_steele_chunked_family;
};
template <>
struct route<blelloch> : tile_route<tile_blelloch> {};
template <std::size_t C>
struct route<chunked_matmul<C>> : tile_route<tile_chunked_matmul> {
    using shared_forward = shared_gate_matmul_family;
};
template <>
struct route<log_space> : tile_route<tile_log_space> {};

template <class S>
constexpr bool is_strategy = requires { typename route<S>::contiguous; };

template <class S, class... Candidates>
constexpr bool is_one_of = (std::is_same_v<S, Candidates> || ...);

/// The accumulator (the type of the carries and of every intermediate): double for the fp64
/// reference and the log-space form; float for bfloat16 storage (values are widened exactly on
/// load and rounded once, to nearest even, on store); else the storage type.
template <class S, class T>
using accumulator_t = std::conditional_t<is_one_of<S, sequential_fp64, log_space>, double,
                                         std::conditional_t<std::is_same_v<T, bfloat16>, float, T>>;

template <class S>
constexpr std::size_t default_chunk() {
    if constexpr (requires { S::chunk; }) return S::chunk;
    else return 0;
}

enum class Pass { forward, backward };

/// Calls f(Family{}) with the family that the table gives strategy S for geometry g in pass P.
/// run_forward, run_backward and family_name all select through here.
template <Pass P, class S, class F>
decltype(auto) with_family(const Geometry& g, F&& f) {
    using R = route<S>;
    if (g.share > 1) {
        if constexpr (P == Pass::forward) return f(typename R::shared_forward{});
        else return f(typename R::shared_backward{});
    }
    if (contiguous_lanes(g)) return f(typename R::contiguous{});
    return f(typename R::strided{});
}

/// The name of the family that runs strategy S on geometry g in `pass` (tests, diagnostics).
template <class S>
std::string_view family_name(const Geometry& g, Pass pass) {
    auto name = [](auto family) { return decltype(family)::name; };
    return pass == Pass::forward ? with_family<Pass::forward, S>(g, name) : with_family<Pass::backward, S>(g, name);
}

template <class S, class T>
void run_forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
    using Acc = accumulator_t<S, T>;
    with_family<Pass::forward, S>(g, [&](auto family) { decltype(family)::template forward<Acc>(g, args, chunk); });
}

template <class S, class T>
void run_backward(const Geometry& g, const BackwardArgs<T>& args, std::size_t chunk) {
    using Acc = accumulator_t<S, T>;
    with_family<Pass::backward, S>(g, [&](auto family) { decltype(family)::template backward<Acc>(g, args, chunk); });
}

}  // namespace olmax::scan::detail
