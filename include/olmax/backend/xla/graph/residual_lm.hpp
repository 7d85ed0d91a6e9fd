#pragma once
// A reference whole training step in traced primitives: a byte-level residual LM
//     h_0 = onehot(ids) E,   h_{l+1} = h_l + s * tanh(h_l W_l + b_l) * (1 + l / depth),   logits = h_L W_out
// with mean cross-entropy, its gradients and AdamW, as ONE program whose layers are one
// `scan_layers` loop. The tests run it on a PJRT plugin against the double-precision reference
// evaluation, and benchmarks/xla measures its compile time against depth.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "olmax/backend/xla/graph/adam.hpp"
#include "olmax/backend/xla/graph/gradients.hpp"
#include "olmax/backend/xla/graph/graph.hpp"
#include "olmax/backend/xla/graph/layer_ops.hpp"

namespace olmax::xla::graph {

struct residual_lm_shape {
    std::int64_t vocab = 256, features = 64, depth = 4, tokens = 128;
    /// Data-parallel copies of the program (xla::device_program replicas): `tokens` is one replica's
    /// share; the loss and the gradients are averaged over the replicas inside the program.
    std::int64_t replicas = 1;
};

/// The traced step. Inputs: state (t, E, W [L,F,F], b [L,F], s [F], W_out, then Adam's m and v of
/// each of the five parameters), then the batch (ids [N], targets [N], byte values as f32).
/// Results: the loss, then the next state in the same order.
struct traced_training_step {
    std::unique_ptr<graph> g = std::make_unique<graph>();
    std::vector<var> results;
    std::vector<std::string> state_names;
    std::size_t state_count() const { return state_names.size(); }
};

inline traced_training_step trace_residual_lm_step(const residual_lm_shape& s, const adam_options& adam) {
    check<graph_error>(s.vocab >= 1 && s.features >= 1 && s.depth >= 1 && s.tokens >= 1 && s.replicas >= 1,
                       "xla::graph: residual LM sizes and replicas must be positive");
    traced_training_step step;
    graph& g = *step.g;
    const std::int64_t V = s.vocab, F = s.features, L = s.depth, N = s.tokens;
    const std::vector<tensor_type> param_types{f32({V, F}), f32({L, F, F}), f32({L, F}), f32({F}), f32({F, V})};
    const std::vector<std::string> names{"embedding", "stack/*/weight", "stack/*/bias", "stack/scale", "head/weight"};

    const var t = g.input(f32({}));
    std::vector<var> params, m, v;
    for (const auto& type : param_types) params.push_back(g.input(type));
    for (const auto& type : param_types) m.push_back(g.input(type));
    for (const auto& type : param_types) v.push_back(g.input(type));
    const var ids = g.input(f32({N})), targets = g.input(f32({N}));

    const auto layer = trace_layer(f32({N, F}), {f32({F, F}), f32({F})}, {f32({F})},
                                   [&](graph&, const var& h, const std::vector<var>& p, const std::vector<var>& tied, const var& index) {
                                       const var pre = matmul(h, p[0]) + broadcast_in_dim(p[1], {N, F}, {1});
                                       const var gain = broadcast_to(index / double(L) + 1.0, {N, F});
                                       return h + broadcast_in_dim(tied[0], {N, F}, {1}) * tanh(pre) * gain;
                                   });
    const var h0 = matmul(one_hot(ids, V), params[0]);
    const var h = scan_layers(layer, h0, {params[1], params[2]}, {params[3]});
    const var local_loss = cross_entropy(matmul(h, params[4]), targets);
    std::vector<var> grads = gradients(local_loss, params);
    var loss = local_loss;
    if (s.replicas > 1) {  // the mean over replicas of equal shares is the mean over the global batch
        loss = all_reduce_sum(local_loss, s.replicas) / double(s.replicas);
        for (auto& grad : grads) grad = all_reduce_sum(grad, s.replicas) / double(s.replicas);
    }

    const var t_next = t + 1.0;
    std::vector<var> new_params, new_m, new_v;
    for (std::size_t k = 0; k < params.size(); ++k) {
        const auto u = adam_update(params[k], grads[k], m[k], v[k], t_next, adam);
        new_params.push_back(u[0]);
        new_m.push_back(u[1]);
        new_v.push_back(u[2]);
    }
    step.results = {loss, t_next};
    step.results.insert(step.results.end(), new_params.begin(), new_params.end());
    step.results.insert(step.results.end(), new_m.begin(), new_m.end());
    step.results.insert(step.results.end(), new_v.begin(), new_v.end());
    step.state_names = {"t"};
    for (const auto& n : names) step.state_names.push_back(n);
    for (const auto& n : names) step.state_names.push_back(n + "/adam_m");
    for (const auto& n : names) step.state_names.push_back(n + "/adam_v");
    return step;
}

}  // namespace olmax::xla::graph
