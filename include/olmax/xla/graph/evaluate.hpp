#pragma once
// The reference semantics of a traced program: every node evaluated on the host in double precision
// by its primitive's `evaluate` (no device). The tests check each gradient rule against finite
// differences of this evaluation, and the emitted module's results (run by a PJRT plugin) against it.

#include <vector>

#include "olmax/xla/graph/graph.hpp"

namespace olmax::xla::graph {

/// Evaluates `results` of `g` on `inputs` (one per graph input, in order) in double precision.
inline std::vector<host_value> evaluate(const graph& g, const std::vector<host_value>& inputs, const std::vector<var>& results) {
    return detail::evaluate_graph(g, inputs, results);
}

}  // namespace olmax::xla::graph
