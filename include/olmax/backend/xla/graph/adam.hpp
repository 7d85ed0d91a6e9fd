#pragma once
// AdamW's update written in traced primitives, so the optimiser step compiles into the same module
// as the forward and backward passes (Loshchilov & Hutter, arXiv:1711.05101):
//     m' = b1 m + (1 - b1) g,   v' = b2 v + (1 - b2) g^2,   t' = t + 1
//     p' = p - lr (m' / (1 - b1^t') / (sqrt(v' / (1 - b2^t')) + eps) + wd p)
// b^t' is exp(t' log b): the step count t is a traced f32 scalar (state on the device), so one
// compiled program serves every step.

#include <cmath>
#include <vector>

#include "olmax/backend/xla/graph/graph.hpp"

namespace olmax::xla::graph {

struct adam_options {
    double learning_rate = 1e-3;
    double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
    double weight_decay = 0;  // decoupled (AdamW)
};

/// One parameter's update: returns {p', m', v'} for the step count t' (already incremented).
inline std::vector<var> adam_update(const var& p, const var& g, const var& m, const var& v, const var& t_next, const adam_options& o) {
    check<graph_error>(p.type() == g.type() && p.type() == m.type() && p.type() == v.type() && t_next.type() == f32({}),
                       "xla::graph: adam_update: parameter ", p.type().str(), ", gradient ", g.type().str(), ", moments ", m.type().str(), " and ",
                       v.type().str(), " must agree and the step count be an f32 scalar");
    check<graph_error>(o.beta1 > 0 && o.beta1 < 1 && o.beta2 > 0 && o.beta2 < 1 && o.epsilon > 0 && o.learning_rate >= 0,
                       "xla::graph: adam_update: need 0 < beta1, beta2 < 1, epsilon > 0 and a learning rate >= 0");
    const var m_next = m * o.beta1 + g * (1 - o.beta1);
    const var v_next = v * o.beta2 + (g * g) * (1 - o.beta2);
    const var correction1 = broadcast_to(1.0 - exp(t_next * std::log(o.beta1)), p.dims());
    const var correction2 = broadcast_to(1.0 - exp(t_next * std::log(o.beta2)), p.dims());
    var step = (m_next / correction1) / (sqrt(v_next / correction2) + o.epsilon);
    if (o.weight_decay != 0) step = step + p * o.weight_decay;
    return {p - step * o.learning_rate, m_next, v_next};
}

}  // namespace olmax::xla::graph
