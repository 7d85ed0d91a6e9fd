#pragma once
// The byte-level language model shared by examples/train_lm.cpp and examples/generate.cpp:
//     bytes -> Embedding -> two streams -> Stack of Reversible(DenseConv<5>, HierarchicalMixer<16>)
//           -> merge streams -> OutputHead (ScaleNorm, W_out, chunked cross-entropy with z-loss)
// i.e. the original Olmax's reversible conv/mixer stem at toy size. Sequence lengths must be a
// multiple of the mixer chunk (16).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <olmax/config/config.hpp>
#include <olmax/data/data.hpp>
#include <olmax/nn/embedding.hpp>
#include <olmax/nn/mixer.hpp>
#include <olmax/nn/nn.hpp>
#include <olmax/olmax.hpp>
#include <olmax/optim/optim.hpp>

namespace byte_lm {

using T = float;
constexpr std::size_t conv_kernel = 5;
constexpr std::size_t mixer_chunk = 16;
using Block = olmax::nn::Reversible<olmax::nn::DenseConv<conv_kernel, T>, olmax::nn::HierarchicalMixer<mixer_chunk, T>>;

/// Trainable parameters of the model for this config, from the layers' shapes (checked against
/// the real model in tests/unit/test_programs.cpp): per block conv0 [K, F, 2F] + its norm scale [2F]
/// + conv1 [K, 2F, F] + the mixer's two [16, 16] matrices and scale [F]; the embedding [256, F] and
/// the output head's [F, 256]. In double: the configs checked here may be far beyond 2^64 bytes.
inline double parameter_count(const olmax::config::TrainConfig& c) {
    const double F = double(c.features), K = double(conv_kernel), M = double(mixer_chunk), V = olmax::data::ByteTokenizer::vocab_size;
    return double(c.depth) * (4 * K * F * F + 3 * F + 2 * M * M) + 2 * V * F;
}

/// Bytes a training run of this config needs at its peak, roughly: per parameter its value and
/// gradient (fp32), AdamW's two moments (fp64) and the copies a checkpoint save holds (64 B in
/// all); per token and feature the activations the reversible stack keeps plus those of one
/// block's recomputation (about 48 floats, flat in depth); per token the logits' chunk (3 floats
/// per vocabulary entry).
inline double estimated_training_bytes(const olmax::config::TrainConfig& c) {
    const double tokens = double(c.batch) * double(c.sequence);
    return 64 * parameter_count(c) + 192 * tokens * double(c.features) + 12 * tokens * double(olmax::data::ByteTokenizer::vocab_size);
}

/// Refuses a config whose model and batch do not fit in the memory this machine has free, before
/// anything is allocated (a clear error instead of std::bad_alloc or the OOM killer).
inline void check_fits_in_memory(const olmax::config::TrainConfig& c) {
    const double need = estimated_training_bytes(c);
    const std::size_t available = olmax::memory::available_bytes();
    olmax::check<olmax::config::config_error>(
        available == 0 || need <= double(available), "config: the model (features ", c.features, ", depth ", c.depth, ": ",
        parameter_count(c), " parameters) with batch ", c.batch, " x sequence ", c.sequence, " needs about ",
        olmax::detail::human_bytes(need), ", more than the ", olmax::detail::human_bytes(double(available)),
        " of memory available; reduce --features, --depth, --batch or --sequence");
}

inline olmax::nn::Config layer_config(const olmax::config::TrainConfig& c) {
    olmax::check<olmax::config::config_error>(c.sequence % std::int64_t(mixer_chunk) == 0, "config: key 'sequence' must be a multiple of ",
                                              mixer_chunk, " (the mixer chunk), got ", c.sequence);
    check_fits_in_memory(c);
    olmax::nn::Config n;
    n.features = std::size_t(c.features);
    n.depth = std::size_t(c.depth);
    n.vocab = olmax::data::ByteTokenizer::vocab_size;
    n.seed = std::uint64_t(c.seed);
    return n;
}

/// The optimiser settings of a training config. Lives with the program, not in olmax::config:
/// config sits beside optim in the library's layering and does not include it.
inline olmax::optim::AdamWConfig optimizer_config(const olmax::config::TrainConfig& c) {
    olmax::optim::AdamWConfig o;
    o.schedule = olmax::optim::LrSchedule{c.lr, c.warmup, c.lr_decay, c.decay_start, c.min_lr};
    o.beta1 = c.beta1;
    o.beta2 = c.beta2;
    o.eps = c.eps;
    o.weight_decay = c.weight_decay;
    o.decay_policy = olmax::optim::parse_weight_decay_policy(c.decay_policy);
    o.agc.clip = c.agc_clip;
    o.max_grad_norm = c.max_grad_norm;
    return o;
}

/// Row shards per batch: one per thread when `data_parallel` is on (see Model::accumulate_gradients).
inline std::size_t shards_for(const olmax::config::TrainConfig& c) {
    return c.data_parallel ? std::size_t(std::max(olmax::backend::host_kernels().num_threads(), 1)) : 1;
}

struct Model {
    olmax::nn::Config config;
    olmax::Generator rng;
    olmax::nn::Embedding<T> embedding;
    olmax::nn::Stack<Block> stack;
    olmax::nn::OutputHead<T> head;

    explicit Model(const olmax::config::TrainConfig& c)
        : config(layer_config(c)), rng(config.seed), embedding(config, rng), stack(config, rng), head(config, rng) {}

    /// [B, S] byte ids -> [B, S, F] features.
    olmax::Tensor<T> hidden(const olmax::Tensor<std::int32_t>& ids) const {
        return olmax::nn::merge_streams(stack.forward(olmax::nn::two_streams(embedding(ids))));
    }

    /// Mean training loss (nats per byte, without the z-loss term; its gradient includes it).
    olmax::Tensor<T> loss(const olmax::data::Batch& batch) const { return head.loss(hidden(batch.inputs), batch.targets); }

    /// Forward and backward of the training loss on `batch`, gradients (times `scale`, e.g.
    /// 1 / grad_accumulation) added to the parameters; returns the batch's mean loss. With
    /// `shards` > 1 the batch's rows are split into that many shards differentiated at the same time
    /// on the default backend's threads (olmax::autodiff::data_parallel_backward): each shard's loss
    /// is weighted by its share of the rows, so the sum is the batch mean and the gradient equals the
    /// one-shard gradient up to rounding (deterministic for a given shard count).
    double accumulate_gradients(const olmax::data::Batch& batch, std::size_t shards, double scale) {
        const std::size_t rows = batch.inputs.shape()[0];
        shards = std::clamp<std::size_t>(shards, 1, rows);
        if (shards == 1) {
            olmax::autodiff::tape_scope tape;
            auto batch_loss = loss(batch);
            const double value = double(batch_loss.item());
            if (scale != 1.0) batch_loss = batch_loss * T(scale);
            batch_loss.backward();
            return value;
        }
        std::vector<olmax::Tensor<T>> tensors;
        for (const auto& p : parameters()) tensors.push_back(p.tensor);
        std::vector<double> shard_means(shards);  // each shard writes its own slot
        auto share = [&](std::size_t s) { return double(rows * (s + 1) / shards - rows * s / shards) / double(rows); };
        olmax::autodiff::data_parallel_backward<T>(tensors, shards, [&](std::size_t s) {
            const auto shard_loss = loss(olmax::data::batch_rows(batch, rows * s / shards, rows * (s + 1) / shards));
            shard_means[s] = double(shard_loss.item());
            return shard_loss * T(scale * share(s));
        });
        double value = 0;
        for (std::size_t s = 0; s < shards; ++s) value += shard_means[s] * share(s);
        return value;
    }

    /// Sum of -log p(target) over real (mask 1) targets and their count, without recording.
    std::pair<double, double> masked_nll(const olmax::data::Batch& batch) const {
        olmax::autodiff::no_grad guard;
        const auto logits = head.logits(hidden(batch.inputs));
        const std::size_t V = logits.shape().back(), n = batch.targets.size();
        double total = 0, count = 0;
        for (std::size_t i = 0; i < n; ++i) {
            if (batch.mask.data()[i] == 0.0f) continue;
            const T* row = logits.data() + i * V;
            double top = row[0];
            for (std::size_t v = 1; v < V; ++v) top = std::max(top, double(row[v]));
            double sum = 0;
            for (std::size_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
            total += top + std::log(sum) - double(row[batch.targets.data()[i]]);
            count += 1;
        }
        return {total, count};
    }

    /// Every trainable tensor with its role; stacked per-layer tensors carry their depth axis.
    std::vector<olmax::optim::Parameter<T>> parameters() {
        std::vector<olmax::optim::Parameter<T>> out;
        auto add = [&out](auto& layer, bool in_stack) {
            olmax::nn::ParameterVisitor<T> visit(
                [&](const std::string& name, olmax::Tensor<T>& tensor, olmax::nn::Role role, olmax::nn::Sharing sharing) {
                    olmax::optim::Parameter<T> q{name, role, tensor};
                    q.stacked_axes = in_stack && sharing == olmax::nn::Sharing::per_layer ? 1 : 0;
                    if (role == olmax::nn::Role::embedding) q.unit_axis = 0;  // one unit per token row
                    out.push_back(std::move(q));
                });
            visit.child(std::remove_reference_t<decltype(layer)>::name, layer);
        };
        add(embedding, false);
        add(stack, true);
        add(head, false);
        return out;
    }

    /// Next-byte logits after `context` (right-aligned in a window of `sequence` bytes, padded on
    /// the left with end-of-document bytes, which is how every document starts in training).
    std::vector<T> next_logits(const std::vector<std::uint8_t>& context, std::size_t sequence) const {
        olmax::autodiff::no_grad guard;
        auto ids = olmax::Tensor<std::int32_t>({1, sequence}, std::int32_t(olmax::data::ByteTokenizer::end_of_document));
        const std::size_t take = std::min(context.size(), sequence);
        for (std::size_t i = 0; i < take; ++i) ids.data()[sequence - take + i] = context[context.size() - take + i];
        const auto logits = head.logits(hidden(ids));
        const std::size_t V = logits.shape().back();
        const T* last = logits.data() + (sequence - 1) * V;
        return std::vector<T>(last, last + V);
    }

    /// `count` sampled bytes continuing `prompt`.
    std::string sample(const std::string& prompt, std::size_t count, std::size_t sequence, const olmax::data::SamplingConfig& sampling,
                       olmax::Generator& sampler) const {
        std::vector<std::uint8_t> context = olmax::data::ByteTokenizer::encode(prompt);
        context.insert(context.begin(), olmax::data::ByteTokenizer::end_of_document);
        std::string out;
        for (std::size_t i = 0; i < count; ++i) {
            const auto logits = next_logits(context, sequence);
            const auto byte = std::uint8_t(olmax::data::sample_token(std::span<const T>(logits), sampling, sampler));
            if (byte == olmax::data::ByteTokenizer::end_of_document) break;
            context.push_back(byte);
            out.push_back(char(byte));
        }
        return out;
    }
};

}  // namespace byte_lm
