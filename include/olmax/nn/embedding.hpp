#pragma once
// Model endpoints: token embedding and the output head with the chunked cross-entropy. They take
// or produce token ids, so they are not stackable layers, but they follow the rest of the contract
// (config constructor, name, visit_parameters) and work with nn::parameters / save / load.

#include <cstdint>
#include <utility>
#include <string_view>

#include "olmax/backend/dispatch.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/embedding.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/loss.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// Token embedding E [V, F], init N(0, (1/F)^2) (the original's); ids [...] -> [..., F].
template <Real T = float>
class Embedding {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "embedding";

    Embedding(const Config& config, Generator& rng) {
        config.checked_features("nn::Embedding");
        check<value_error>(config.vocab > 0, "nn::Embedding: vocab must be positive, got 0");
        table_ = parameter(randn<T>({config.vocab, config.features}, rng, T{0}, T(1.0 / double(config.features))));
    }

    Tensor<T> forward(const Tensor<std::int32_t>& ids) const { return embedding(table_, ids); }
    Tensor<T> operator()(const Tensor<std::int32_t>& ids) const { return forward(ids); }
    void visit_parameters(ParameterVisitor<T>& visit) { visit("table", table_, Role::embedding); }

private:
    Tensor<T> table_;
};

/// Output head: L2 ScaleNorm without scale, then hidden . W_out [F, V] (init N(0, 1), the
/// original's 1/D with one device). `loss` never forms the [N, V] logits: chunked cross-entropy
/// with z-loss (Config::z_loss, Config::loss_chunk_tokens); the value excludes the z-loss term,
/// the gradient includes it (as the original).
template <Real T = float>
class OutputHead {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "head";

    OutputHead(const Config& config, Generator& rng)
        : w_out_(parameter(randn<T>({config.checked_features("nn::OutputHead"), config.vocab}, rng))),
          eps_(T(config.norm_eps)),
          options_{config.z_loss, config.loss_chunk_tokens} {}

    /// Mean next-token loss of `hidden` [..., F] against `targets` (same leading shape, int32).
    Tensor<T> loss(const Tensor<T>& hidden, const Tensor<std::int32_t>& targets) const {
        backend::op_scope on("nn::OutputHead::loss", hidden, targets, w_out_);
        const std::size_t features = w_out_.shape()[0];
        check<shape_error>(hidden.rank() >= 1 && hidden.shape().back() == features && hidden.size() / features == targets.size(),
                           "nn::OutputHead: hidden of shape ", to_string(hidden.shape()), " does not match targets of shape ",
                           to_string(targets.shape()), " and ", features, " features");
        const std::size_t n = targets.size();
        Tensor<T> flat = reshape(scale_norm(hidden, Tensor<T>(), eps_), Shape{n, features});
        return chunked_cross_entropy(flat, w_out_, reshape(targets, Shape{n}), options_);
    }


    /// Full logits [..., V] (for evaluation and sampling).
    Tensor<T> logits(const Tensor<T>& hidden) const { return matmul(scale_norm(hidden, Tensor<T>(), eps_), w_out_); }

    void visit_parameters(ParameterVisitor<T>& visit) { visit("w_out", w_out_, Role::weight); }

private:
    Tensor<T> w_out_;
    T eps_;
    ChunkedLossOptions options_;
};

}  // namespace olmax::nn
