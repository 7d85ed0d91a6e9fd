#pragma once
// Lowering of a traced program to ONE StableHLO module (function_builder): every node the results
// need, in order, by its primitive's `emit` (graph.hpp's registry; detail::emit_graph in ir.hpp),
// with the module's arguments, donated state and SPMD annotations set here.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/graph/graph.hpp"
#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/module.hpp"

namespace olmax::xla::graph {

/// Data parallelism by XLA's SPMD partitioner: the program is written for the global batch and
/// compiled for `devices` devices; `split_inputs` (inputs of the graph, e.g. the batch) are split
/// along their first axis, one equal share per device, everything else is replicated. The
/// partitioner inserts the collectives the split implies (the all-reduce of a gradient summed over
/// the batch), so the traced program has none.
struct spmd_partitioning {
    std::size_t devices = 1;
    std::vector<var> split_inputs{};
};

/// The program as a StableHLO module: `@main` takes the graph's inputs in the order they were made
/// and returns `results`. `name` becomes the module name and the start of its cache key. With
/// `donated_state` = k, inputs 0 .. k-1 are donated to the last k results (a step's state, which the
/// device then updates in place instead of holding the old and the new copy at once). With
/// `spmd.devices` > 1 the module is annotated for the SPMD partitioner (spmd_partitioning).
inline stablehlo::emitted_module emit(const graph& g, std::string_view name, const std::vector<var>& results, std::size_t donated_state = 0,
                                      const spmd_partitioning& spmd = {}) {
    check<graph_error>(!results.empty(), "xla::graph: emit: no results");
    std::vector<tensor_type> inputs;
    for (auto i : g.inputs()) inputs.push_back(g.at(i).outputs[0]);
    for (const auto& r : results)
        check<graph_error>(&r.owner() == &g && r.type().elem == element::f32, "xla::graph: emit: results must be f32 values of this graph");
    check<graph_error>(donated_state <= inputs.size() && donated_state <= results.size(), "xla::graph: emit: ", donated_state,
                       " donated state tensors for ", inputs.size(), " inputs and ", results.size(), " results");
    stablehlo::function_builder b(inputs);
    for (std::size_t i = 0; i < donated_state; ++i) {
        const std::size_t out = results.size() - donated_state + i;
        check<graph_error>(results[out].type() == inputs[i], "xla::graph: emit: state ", i, " enters as ", inputs[i].str(), " but leaves as ",
                           results[out].type().str(), ", so it cannot be updated in place");
        b.alias_output(i, out);
    }
    std::vector<bool> split(inputs.size(), false);
    if (spmd.devices > 1) {
        for (const auto& x : spmd.split_inputs) {
            const auto at = std::find(g.inputs().begin(), g.inputs().end(), x.node());
            check<graph_error>(&x.owner() == &g && at != g.inputs().end(), "xla::graph: emit: a value to split over the devices is not an input of this graph");
            split[std::size_t(at - g.inputs().begin())] = true;
        }
        b.partition(spmd.devices, split);
    }
    const auto values = detail::emit_graph(b, g, b.args(), results);
    stablehlo::emitted_module m;
    m.partitions = std::max<std::size_t>(spmd.devices, 1);
    m.split_leading = split;
    m.text = b.finish(name, values);
    m.key = std::string(name) + "." + std::to_string(std::hash<std::string>{}(m.text));
    m.inputs = inputs;
    for (const auto& r : results) m.outputs.push_back(r.type());
    m.donated = donated_state;
    return m;
}

}  // namespace olmax::xla::graph
