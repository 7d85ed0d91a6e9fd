#pragma once
// QRNN layer (Bradbury et al. 2016, "Quasi-Recurrent Neural Networks") on olmax's scan engine.
//
// Gates and candidate come from one causal convolution over time ([batch, time, features] in,
// kernel K taps), split along channels; the forget gate is f = hard_sigmoid(.) as in Olmax.
// Poolings (c_{-1} = 0):
//   original  h = f h + z                 (Olmax: z is the raw projection, no (1 - f) factor)
//   f         h = f h + (1 - f) tanh(z)   (the paper's f-pooling)
//   fo        c = f c + (1 - f) tanh(z),  h = sigmoid(o) c
//   ifo       c = f c + sigmoid(i) tanh(z), h = sigmoid(o) c
// The recurrence runs through olmax::scan::scan<Strategy>, whose custom backward is exact
// (da_t = g_t h_{t-1}); everything else is ordinary differentiable ops. Decoding
// (continue_sequence) carries the convolution's last K-1 inputs and the cell c.

#include <cmath>
#include <string_view>
#include <utility>

#include "olmax/backend/dispatch.hpp"
#include "olmax/core/random.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/ops/conv.hpp"
#include "olmax/ops/elementwise.hpp"
#include "olmax/ops/pointwise.hpp"
#include "olmax/ops/shape.hpp"
#include "olmax/scan/scan.hpp"

namespace olmax::nn {

enum class QrnnPooling { original, f, fo, ifo };

template <class Strategy = scan::sequential_vectorized, Real T = float>
class QRNN {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "qrnn";

    /// features -> features, kernel 5 (the original block's convolution), original pooling.
    QRNN(const Config& config, Generator& rng)
        : QRNN(config.checked_features("nn::QRNN"), config.features, 5, QrnnPooling::original, rng) {}

    QRNN(std::size_t in_features, std::size_t hidden, std::size_t kernel, QrnnPooling pooling, Generator& rng) : pooling_(pooling) {
        check<value_error>(in_features > 0 && hidden > 0 && kernel > 0, "nn::QRNN: in_features, hidden and kernel must be positive, got ",
                           in_features, ", ", hidden, ", ", kernel);
        hidden_ = hidden;
        const T std_dev = T(1) / std::sqrt(T(kernel * in_features));
        weight_ = parameter(randn<T>({kernel, in_features, gate_count() * hidden}, rng, T(0), std_dev));
        bias_ = parameter(Tensor<T>({gate_count() * hidden}));
    }

    /// x [batch, time, in_features] -> h [batch, time, hidden].
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return pool(causal_conv1d(x, weight_, bias_), {}, nullptr); }

    /// The next steps of a sequence (nn::continue_sequence): the convolution's last K-1 inputs
    /// [batch, K-1, in_features] and the cell c [batch, hidden] (undefined: zeros) carried on.
    struct sequence_state {
        Tensor<T> conv, cell;
    };
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& state, const LayerContext& = {}) const {
        if (state.cell.defined() && x.defined() && x.rank() == 3)  // (other inputs: continue_taps says what is wrong)
            check<shape_error>(state.cell.shape() == Shape{x.extent(0), hidden_}, "nn::QRNN: carried cell of shape ", to_string(state.cell.shape()),
                               " does not match [batch, hidden] = [", x.extent(0), ", ", hidden_, "]");
        const Tensor<T> z = detail::continue_taps(x, state.conv, weight_.extent(0), [&](const Tensor<T>& seen) { return causal_conv1d(seen, weight_, bias_); },
                                                  "nn::QRNN");
        return pool(z, state.cell, &state.cell);
    }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("weight", weight_, Role::weight);
        visit("bias", bias_, Role::bias);
    }

    std::size_t hidden() const { return hidden_; }
    QrnnPooling pooling() const { return pooling_; }

private:
    /// The pooling of the convolution's output z [batch, time, gates x hidden] from cell h0
    /// (undefined: zeros); the last cell goes to *cell_out when given.
    Tensor<T> pool(const Tensor<T>& z, const Tensor<T>& h0, Tensor<T>* cell_out) const {
        auto part = [&](std::size_t i) { return slice(z, 2, i * hidden_, (i + 1) * hidden_); };
        const Tensor<T> forget_pre = part(1), forget = hard_sigmoid(forget_pre);
        auto cells = [&](const Tensor<T>& input) {
            auto s = scan::scan_with_state<Strategy>(forget, input, {.h0 = h0});
            if (cell_out) *cell_out = std::move(s.h_last);
            return std::move(s.h);
        };
        if (pooling_ == QrnnPooling::original) return cells(part(0));
        // The gate chains as single ops (olmax::pointwise): one pass each, and no tensor per step.
        const Tensor<T> input =
            pooling_ == QrnnPooling::ifo
                ? pointwise("qrnn_input", [](auto i, auto z) { return math::sigmoid(i) * math::tanh(z); }, part(3), part(0))
                : pointwise("qrnn_input", [](auto f, auto z) { return (1 - math::hard_sigmoid(f)) * math::tanh(z); }, forget_pre, part(0));
        const Tensor<T> c = cells(input);
        if (pooling_ == QrnnPooling::f) return c;
        return pointwise("qrnn_output", [](auto o, auto cell) { return math::sigmoid(o) * cell; }, part(2), c);
    }

    /// Channels of the projection: candidate and forget, plus output and input gates as needed.
    std::size_t gate_count() const {
        switch (pooling_) {
            case QrnnPooling::original:
            case QrnnPooling::f: return 2;
            case QrnnPooling::fo: return 3;
            case QrnnPooling::ifo: return 4;
        }
        return 2;
    }

    QrnnPooling pooling_;
    std::size_t hidden_ = 0;
    Tensor<T> weight_, bias_;
};

}  // namespace olmax::nn
