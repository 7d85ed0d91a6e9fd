#pragma once
// The traced program: a graph of StableHLO-level primitives that a whole training step (forward,
// gradients, optimiser update) is built into before it is emitted as ONE StableHLO module
// (emit.hpp) and compiled once by a PJRT plugin.
//
//     graph g;
//     var x = g.input(f32({8, 64})), w = g.input(f32({64, 32}));
//     var loss = sum(tanh(matmul(x, w)), {0, 1});
//     auto module = emit(g, "step", {loss});   // emit.hpp
//
// Programs are built by the tracer (olmax/trace/), which runs ordinary olmax code on traced
// tensors and records each primitive on olmax's one tape with its gradient rule. Every primitive
// is one struct (ir.hpp says what it holds) in its family's header, listed once in the registry
// prim::all (ir.hpp):
//   primitives/elementwise.hpp  constants, iota, arithmetic, exp / log / tanh / ..., compare, select
//   primitives/structure.hpp    broadcast, reshape, transpose, slice, pad, concatenate, sum, max
//   primitives/dot.hpp          matrix products, the cross-replica sum
//   primitives/gather.hpp       rows by index and their scatter-add
//   primitives/scans.hpp        the linear scan, Mamba's selective scan and its gradient
//   primitives/layer_loop.hpp   depth as one loop (scan_layers) and its reverse loop
// A new primitive is one struct in one of them (or a new header included here) and one entry in
// prim::all; the lowering (emit.hpp), the reference evaluation (evaluate.hpp) and the tape
// (trace/primitives.hpp) reach it through its node's descriptor.
//
// Values are f32 tensors with static shapes, plus i1 predicates (compare) for select.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "olmax/xla/graph/ir.hpp"
#include "olmax/xla/graph/primitives/dot.hpp"
#include "olmax/xla/graph/primitives/elementwise.hpp"
#include "olmax/xla/graph/primitives/gather.hpp"
#include "olmax/xla/graph/primitives/layer_loop.hpp"
#include "olmax/xla/graph/primitives/scans.hpp"
#include "olmax/xla/graph/primitives/structure.hpp"

namespace olmax::xla::graph {

namespace detail {

template <class... P>
consteval std::array<const primitive_info*, sizeof...(P)> table_of(primitive_list<P...>) {
    static_assert((primitive_definition<P> && ...), "xla::graph: an entry of prim::all is not a complete primitive definition");
    return {&info_of<P>...};
}

}  // namespace detail

/// Every primitive's descriptor, in registry order (prim::all). Building it instantiates every
/// entry's descriptor, so a registered primitive without a definition, or one missing a part,
/// fails to compile here.
inline constexpr std::array<const primitive_info*, prim::all::size> primitive_table = detail::table_of(prim::all{});

namespace detail {
consteval bool registry_is_consistent() {
    for (std::size_t i = 0; i < primitive_table.size(); ++i) {
        if (primitive_table[i]->index != i) return false;
        for (std::size_t j = 0; j < i; ++j)
            if (primitive_table[i]->name == primitive_table[j]->name) return false;
    }
    return true;
}
}  // namespace detail
static_assert(detail::registry_is_consistent(), "xla::graph: two primitives of prim::all share a name");

/// The primitive named `name` (as StableHLO and error messages spell it); null when none is.
inline const primitive_info* find_primitive(std::string_view name) {
    for (const primitive_info* p : primitive_table)
        if (p->name == name) return p;
    return nullptr;
}

}  // namespace olmax::xla::graph
