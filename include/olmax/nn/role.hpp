#pragma once
// What a trainable parameter is for: one enum, attached by the layer that creates the parameter
// (nn::ParameterVisitor) and read by the optimisers (optim::Parameter: weight decay per role).

#include <string_view>

#include "olmax/core/error.hpp"

namespace olmax::nn {

/// What a parameter is for, attached where the layer creates it. Optimiser groups (weight decay,
/// learning-rate multipliers) select by role, never by substrings of names (the original Olmax's
/// name-based weight-decay exclusion matched every block by accident).
/// The numeric values are written to parameter files (nn::save_parameters): add new roles at the
/// end, never reorder.
enum class Role {
    weight,      // dense / conv / mixer matrices
    bias,        // additive biases
    norm_scale,  // scales of normalisation layers (init 1)
    embedding,   // input or output embedding tables
    scalar,      // scalar gates (residual / ReZero)
    other,       // anything else
};

inline std::string_view role_name(Role role) {
    switch (role) {
        case Role::weight: return "weight";
        case Role::bias: return "bias";
        case Role::norm_scale: return "norm_scale";
        case Role::embedding: return "embedding";
        case Role::scalar: return "scalar";
        case Role::other: return "other";
    }
    return "other";
}

/// The role named `text` (as written by role_name); throws value_error naming the valid ones.
inline Role parse_role(std::string_view text) {
    for (Role role : {Role::weight, Role::bias, Role::norm_scale, Role::embedding, Role::scalar, Role::other})
        if (role_name(role) == text) return role;
    throw value_error(olmax::detail::concat("parse_role: unknown role '", text,
                                            "' (expected weight, bias, norm_scale, embedding, scalar or other)"));
}

}  // namespace olmax::nn
