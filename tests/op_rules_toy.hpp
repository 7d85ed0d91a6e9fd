#pragma once
// docs/ARCHITECTURE.md's worked examples, verbatim there (CTest docs_excerpts compares them): an op
// defined outside olmax with its typed key, rule and samples ("Adding an op"), and a primitive
// defined outside olmax with the op whose rule it is ("Adding a primitive"). They register
// themselves when included, so the generic checks of tests/unit/test_op_rules.cpp (the graph's
// reference evaluation) and tests/xla/test_op_rules_plugin.cpp (the real XLA CPU plugin) run them
// with olmax's ops.

#include <cmath>
#include <span>
#include <string_view>
#include <vector>

#include <olmax/olmax.hpp>
#include <olmax/trace/trace.hpp>

// ---- docs/ARCHITECTURE.md, "Adding an op" (verbatim there) ----------------------------------------
namespace toy_ops {

/// The op: softcap(x, cap) = cap tanh(x / cap), a soft clip to (-cap, cap).
template <olmax::Real T>
olmax::Tensor<T> softcap(const olmax::Tensor<T>& x, double cap);

/// Its key: the op's name, its typed attributes, its samples and its eager form.
struct softcap_key {
    static constexpr std::string_view name = "toy_softcap";
    struct attrs {
        double cap = 1;
    };
    static std::vector<olmax::backend::trace::sample<attrs>> samples(olmax::Generator& rng) {
        return {{{olmax::rand<float>({5}, rng, -4.0f, 4.0f)}, {2.0}}, {{olmax::rand<float>({2, 3}, rng, -1.0f, 1.0f)}, {0.5}}};
    }
    template <olmax::Real T>
    static olmax::Tensor<T> eager(std::span<const olmax::Tensor<T>> in, const attrs& a) {
        return softcap(in[0], a.cap);
    }
};

template <olmax::Real T>
olmax::Tensor<T> softcap(const olmax::Tensor<T>& x, double cap) {
    olmax::backend::op_scope on(softcap_key::name, x);
    return on.run<softcap_key>({x}, {.cap = cap}, [&] {  // traced: its rule, found by its key
        auto y = olmax::Tensor<T>::uninitialized(x.shape());
        olmax::backend::map(x.size(), y.data(), [c = T(cap)](T v) { return c * std::tanh(v / c); }, x.data());
        return olmax::autodiff::custom_op("toy_softcap", y, {x},
                                          [y = y.detach(), c = T(cap)](const olmax::Tensor<T>& dy, olmax::autodiff::GradientSink<T>& g) {
                                              g.add(0, dy * (1 - y * y / (c * c)));  // d/dx c tanh(x / c) = 1 - tanh^2
                                          });
    });
}

/// Its rule, in the traced primitives (whose gradients the tape records); registered before main.
inline const bool softcap_registered = (olmax::backend::trace::register_rule<softcap_key>(
                                            [](olmax::backend::trace::traced_inputs in, const softcap_key::attrs& a) {
                                                namespace p = olmax::trace::primitives;
                                                return olmax::backend::trace::traced_outputs{p::scale(p::tanh(p::scale(in[0], 1 / a.cap)), a.cap)};
                                            }),
                                        true);

}  // namespace toy_ops
// ---- end of "Adding an op" ------------------------------------------------------------------------

// ---- docs/ARCHITECTURE.md, "Adding a primitive" (verbatim there) ----------------------------------
namespace toy_ops {

namespace gx = olmax::xla::graph;

/// The primitive y = x^3: its shape rule and node (make), StableHLO lowering (emit), reference
/// evaluation in double (evaluate) and gradient rule, written in the primitives (gradient).
struct cube_primitive {
    static constexpr std::string_view name = "toy_cube";
    static constexpr bool defined_outside_olmax = true;  // olmax's own are entries of prim::all instead
    static gx::var make(const gx::var& x) { return gx::detail::make<cube_primitive>({x}, x.type()); }
    static gx::value emit(gx::function_builder& b, const gx::node&, const std::vector<gx::value>& in) {
        return b.binary("multiply", b.binary("multiply", in[0], in[0]), in[0]);
    }
    static void evaluate(const gx::node&, const std::vector<const gx::host_value*>& in, gx::host_value& out) {
        for (std::size_t k = 0; k < out.data.size(); ++k) out.data[k] = in[0]->data[k] * in[0]->data[k] * in[0]->data[k];
    }
    static void gradient(gx::vjp& v) { v.dx[0] = v.gy[0] * (v.x[0] * v.x[0]) * 3.0; }
};

/// An op whose rule is that primitive: cube(x) = x^3.
template <olmax::Real T>
olmax::Tensor<T> cube(const olmax::Tensor<T>& x);

struct cube_key {
    static constexpr std::string_view name = "toy_cube";
    struct attrs {};
    static std::vector<olmax::backend::trace::sample<attrs>> samples(olmax::Generator& rng) {
        return {{{olmax::rand<float>({4}, rng, -2.0f, 2.0f)}}, {{olmax::rand<float>({2, 3}, rng, -2.0f, 2.0f)}}};
    }
    template <olmax::Real T>
    static olmax::Tensor<T> eager(std::span<const olmax::Tensor<T>> in, const attrs&) {
        return cube(in[0]);
    }
};

template <olmax::Real T>
olmax::Tensor<T> cube(const olmax::Tensor<T>& x) {
    olmax::backend::op_scope on(cube_key::name, x);
    return on.run<cube_key>({x}, {}, [&] {
        olmax::Tensor<T> y;
        {
            olmax::autodiff::no_grad off;
            y = x * x * x;
        }
        return olmax::autodiff::custom_op("toy_cube", y, {x}, [x = x.detach()](const olmax::Tensor<T>& dy, olmax::autodiff::GradientSink<T>& g) {
            g.add(0, dy * x * x * T(3));
        });
    });
}

/// The rule: one node of the primitive, recorded on the tape with the primitive's gradient.
inline const bool cube_registered = (olmax::backend::trace::register_rule<cube_key>(
                                         [](olmax::backend::trace::traced_inputs in, const cube_key::attrs&) {
                                             return olmax::trace::primitives::apply(cube_primitive::make(olmax::trace::var_of(in[0])), {in[0]});
                                         }),
                                     true);

}  // namespace toy_ops
// ---- end of "Adding a primitive" ------------------------------------------------------------------
