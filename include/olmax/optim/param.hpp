#pragma once
// Trainable parameters as optimisers see them: a tensor plus a name (for checkpoints and messages)
// and a role fixed where the layer creates it. Weight decay groups are chosen by role, never by
// matching substrings of names (the original skipped every parameter whose scope path contained
// "norm" or "rezero"; every block parameter lives under a ".../prenorm:0/..." scope, so in effect
// it decayed only the input and output embeddings).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/core/core.hpp"
#include "olmax/nn/role.hpp"

namespace olmax::optim {

/// Which roles receive decoupled weight decay.
enum class WeightDecayPolicy {
    matrices,         // weight and embedding (the usual "no decay on norms and biases")
    embeddings_only,  // what the original's HEAD did in effect (PR #100 found it at least as good)
    all,              // every parameter
    none,
};

inline std::string_view to_string(WeightDecayPolicy policy) {
    switch (policy) {
        case WeightDecayPolicy::matrices: return "matrices";
        case WeightDecayPolicy::embeddings_only: return "embeddings_only";
        case WeightDecayPolicy::all: return "all";
        case WeightDecayPolicy::none: return "none";
    }
    return "none";
}

inline WeightDecayPolicy parse_weight_decay_policy(std::string_view text) {
    for (auto policy : {WeightDecayPolicy::matrices, WeightDecayPolicy::embeddings_only, WeightDecayPolicy::all, WeightDecayPolicy::none})
        if (to_string(policy) == text) return policy;
    throw value_error(olmax::detail::concat("parse_weight_decay_policy: unknown policy '", text,
                                     "' (expected matrices, embeddings_only, all or none)"));
}

/// Whether parameters of `role` receive weight decay under `policy` (roles: nn::Role, nn/role.hpp).
inline bool receives_weight_decay(nn::Role role, WeightDecayPolicy policy) {
    switch (policy) {
        case WeightDecayPolicy::matrices: return role == nn::Role::weight || role == nn::Role::embedding;
        case WeightDecayPolicy::embeddings_only: return role == nn::Role::embedding;
        case WeightDecayPolicy::all: return true;
        case WeightDecayPolicy::none: return false;
    }
    return false;
}

/// One trainable tensor as the optimiser sees it. `tensor` is a handle: the optimiser updates the
/// caller's parameter in place and reads its `grad()`.
template <Real T>
struct Parameter {
    std::string name;
    nn::Role role = nn::Role::weight;
    Tensor<T> tensor;
    /// Multiplies the scheduled learning rate for this parameter (per-parameter LR prior).
    double lr_scale = 1.0;
    /// Leading axes that index stacked layers: AGC norms never mix different layers.
    std::size_t stacked_axes = 0;
    /// The axis that indexes output units for unit-wise AGC (negative counts from the end). The
    /// default -1 fits olmax's `y = x @ W` layout, W[..., in, out]; tensors of rank <= 1 (after
    /// the stacked axes) use one unit per element, as in the NFNet reference.
    long unit_axis = -1;
};

template <Real T>
Parameter<T> make_parameter(std::string name, nn::Role role, Tensor<T> tensor, double lr_scale = 1.0) {
    return Parameter<T>{std::move(name), role, std::move(tensor), lr_scale};
}

}  // namespace olmax::optim
