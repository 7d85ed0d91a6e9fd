#pragma once
// The traced program: a graph of StableHLO-level primitives that a whole training step (forward,
// gradients, optimiser update) is built into, then emitted as ONE StableHLO module (emit.hpp) and
// compiled once by a PJRT plugin. The tracer (olmax/trace/) builds it from ordinary olmax code; a
// graph built by hand: docs/xla.md, "2. Choosing the plugin".
//
// This header includes every family of primitives in the registry prim::all (ir.hpp says what a
// primitive holds; a new family's header is included here). Values are f32 tensors with static
// shapes, plus i1 predicates (compare) for select.

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
