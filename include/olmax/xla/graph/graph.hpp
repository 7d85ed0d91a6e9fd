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

// ---- convenience forms (compositions of the primitives; they need no rules of their own) -------

/// x broadcast to `out_dims` with numpy's trailing alignment (x's dims match the last ones or are 1).
inline var broadcast_to(const var& x, const dims_t& out_dims) {
    if (x.dims() == out_dims) return x;
    check<graph_error>(x.type().rank() <= out_dims.size(), "xla::graph: cannot broadcast ", x.type().str(), " to rank ", out_dims.size());
    dims_t dims;
    for (std::size_t i = 0; i < x.type().rank(); ++i) dims.push_back(static_cast<std::int64_t>(out_dims.size() - x.type().rank() + i));
    return broadcast_in_dim(x, out_dims, dims);
}
inline var mean(const var& x, const dims_t& axes) {
    double count = 1;
    for (auto a : axes) count *= double(x.dims().at(static_cast<std::size_t>(a)));
    return sum(x, axes) / count;
}
/// log(sum(exp(x))) over the last axis, stabilised by the (gradient-free) row maximum.
inline var logsumexp_last(const var& x) {
    const std::int64_t last = static_cast<std::int64_t>(x.type().rank()) - 1;
    dims_t kept(x.dims().begin(), x.dims().end() - 1), keep_dims;
    for (std::int64_t d = 0; d < last; ++d) keep_dims.push_back(d);
    const var m = stop_gradient(max(x, {last}));
    const var shifted = x - broadcast_in_dim(m, x.dims(), keep_dims);
    return log(sum(exp(shifted), {last})) + m;
}

}  // namespace olmax::xla::graph
