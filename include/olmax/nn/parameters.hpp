#pragma once
// Parameter listing, gradient reset and serialisation for every conforming layer, all through
// `visit_parameters` (so they work the same for a Linear, a Reversible block or a whole Stack).

#include <cstdint>
#include <cstring>
#include <istream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "olmax/nn/contract.hpp"

namespace olmax::nn {

/// One trainable tensor with its deterministic hierarchical name and its role.
template <Real T>
struct NamedParameter {
    std::string name;    ///< e.g. "stack/dense/conv0/weight" (stacked) or "linear/weight"
    Tensor<T> tensor;    ///< the trainable leaf (a stacked one has a leading depth axis)
    Role role;
    Sharing sharing;
    bool stacked = false;  ///< has a leading [depth] axis (inside nn::Stack, not tied)
};

/// Every parameter of `layer`, in visiting order, names prefixed by `L::name` (the names io's
/// parameter files store). optim::parameters_of(layer) is the same walk for an optimiser: the same
/// tensors in the same order, named without the `L::name/` prefix, with what AdamW needs to know.
template <class L>
std::vector<NamedParameter<typename L::value_type>> parameters(L& layer) {
    static_assert(detail::declares_value_type<L> && detail::declares_name<L> && detail::has_parameters<L>,
                  "olmax::nn::parameters: the type must declare value_type and name and have visit_parameters(ParameterVisitor<value_type>&)");
    using T = typename L::value_type;
    std::vector<NamedParameter<T>> out;
    ParameterVisitor<T> visit([&](const std::string& name, Tensor<T>& t, Role role, Sharing sharing) {
        out.push_back({name, t, role, sharing, false});
    });
    visit.child(L::name, layer);
    return out;
}

/// Parameters of one role (e.g. `Role::weight` for weight decay).
template <class L>
std::vector<NamedParameter<typename L::value_type>> parameters_with_role(L& layer, Role role) {
    auto all = parameters(layer);
    std::erase_if(all, [role](const auto& p) { return p.role != role; });
    return all;
}

/// Total number of scalar parameters.
template <class L>
std::size_t parameter_count(L& layer) {
    std::size_t n = 0;
    for (const auto& p : parameters(layer)) n += p.tensor.size();
    return n;
}

/// Drops the accumulated gradient of every parameter.
template <class L>
void zero_grad(L& layer) {
    for (auto& p : parameters(layer)) p.tensor.zero_grad();
}

/// The thin user-facing wrapper around a layer's details: owns the layer, calls it and lists its
/// parameters (olmax::io::save_parameters / load_parameters write and read them).
///
///     olmax::nn::Module<olmax::nn::Linear<double>> linear(config);
///     auto y = linear(x);
template <class L>
class Module {
    static_assert(assert_layer<L>());

public:
    using value_type = typename L::value_type;
    using layer_type = L;

    explicit Module(const typename L::config_type& config) : Module(config, seeded(config)) {}
    Module(const typename L::config_type& config, Generator&& rng) : layer_(config, rng) {}
    Module(const typename L::config_type& config, Generator& rng) : layer_(config, rng) {}

    Tensor<value_type> operator()(const Tensor<value_type>& x, const LayerContext& ctx = {}) const { return layer_.forward(x, ctx); }
    auto parameters() { return nn::parameters(layer_); }
    void zero_grad() { nn::zero_grad(layer_); }
    L& layer() { return layer_; }
    const L& layer() const { return layer_; }

private:
    static Generator seeded(const typename L::config_type& config) {
        if constexpr (requires { config.seed; }) return Generator(config.seed);
        else return Generator(0);
    }
    L layer_;
};

}  // namespace olmax::nn
