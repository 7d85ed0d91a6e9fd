#pragma once
// The byte-level language model the main job (examples/train_lm) trains:
//     bytes -> Embedding -> Stack<block> -> OutputHead (ScaleNorm, W_out, chunked cross-entropy with z-loss)
// The block is a recipe type (models/recipes.hpp; ConvMixer, the original Olmax's reversible
// conv/mixer stem, by default); a reversible block runs on two streams (nn::two_streams before the
// stack, merge_streams after).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/autodiff/autodiff.hpp"
#include "olmax/config/key_value.hpp"
#include "olmax/core/core.hpp"
#include "olmax/data/loader.hpp"
#include "olmax/data/sampling.hpp"
#include "olmax/data/tokenizer.hpp"
#include "olmax/models/recipes.hpp"
#include "olmax/nn/continuation.hpp"
#include "olmax/nn/embedding.hpp"
#include "olmax/nn/reversible.hpp"
#include "olmax/nn/stack.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/optim/parameters_of.hpp"

namespace olmax::models {

/// The model's keys of a program's config (train::TrainConfig composes them with the other modules'):
/// the block recipe, the sizes and the recompute budget.
struct ByteLMSettings {
    std::string block = "conv_mixer";
    std::int64_t features = 64;
    std::int64_t depth = 2;
    std::int64_t kept_layers = -1;  // recompute as a budget (nn::Stack::keep_activations); -1: ByteLM::keep_activations chooses

    static const std::vector<config::Field<ByteLMSettings>>& fields() {
        using C = ByteLMSettings;
        using config::Field;
        static const std::vector<Field<C>> f{
            Field<C>{"block", &C::block, "block type of the model (olmax::models recipes)",
                     {"conv_mixer", "qrnn", "mamba", "moe", "mamba2", "gated_deltanet", "attention", "hybrid"}},
            Field<C>{"features", &C::features, "model width"}.in(1, 1 << 16),
            Field<C>{"depth", &C::depth, "number of blocks"}.in(1, 1 << 12),
            Field<C>{"kept_layers", &C::kept_layers,
                     "recompute as a budget: the first N reversible blocks keep their activations for the backward instead of "
                     "rebuilding them from their outputs (faster, more memory: each shard thread keeps its own; more than depth "
                     "keeps all; on XLA the compiled step stores what their backward reads, in whole repeats of the block's layer "
                     "pattern); -1: as many as fit half the memory available beyond the model's estimate (on XLA: none), "
                     "0: every block rebuilt (memory flat in depth)"}
                .in(-1, 1 << 12),
        };
        return f;
    }
};

/// A program config the model is built from: its ByteLMSettings plus the seed of the initialisation
/// and the batch it must train (train::TrainConfig is one).
template <class C>
concept ByteLMRunConfig = std::derived_from<C, ByteLMSettings> && requires(const C& c) {
    { c.seed } -> std::convertible_to<std::int64_t>;
    { c.batch } -> std::convertible_to<std::int64_t>;
    { c.sequence } -> std::convertible_to<std::int64_t>;
};

/// How ByteLM::sample runs the model for each byte: `stepwise`, each byte once through the layers,
/// every block carrying its state (ByteLM::Decoder; a block that cannot continue a sequence runs
/// the window instead), or `window`, the whole window of `sequence` bytes again (next_logits).
enum class Decoding { stepwise, window };

/// ByteLM::score's result: the summed next-byte loss of a text and how many bytes it predicted.
struct TextScore {
    double nats = 0;
    std::size_t predictions = 0;

    double nats_per_byte() const { return predictions ? nats / double(predictions) : 0.0; }
    double bits_per_byte() const { return nats_per_byte() / std::log(2.0); }
    TextScore& operator+=(const TextScore& other) {
        nats += other.nats;
        predictions += other.predictions;
        return *this;
    }
};

/// The model's own settings (a program reads them from its config: ByteLMConfig::from).
struct ByteLMConfig {
    std::size_t features = 64;
    std::size_t depth = 2;
    std::uint64_t seed = 0;

    template <ByteLMRunConfig C>
    static ByteLMConfig from(const C& c) {
        check<config::config_error>(c.features > 0 && c.depth > 0, "config: keys 'features' and 'depth' must be positive, got ", c.features,
                                    " and ", c.depth);
        return {std::size_t(c.features), std::size_t(c.depth), std::uint64_t(c.seed)};
    }
};

/// The byte-level LM over a block recipe (ConvMixer by default) in element type T.
template <class Recipe = ConvMixer, Real T = float>
class ByteLM {
public:
    using value_type = T;
    using recipe_type = Recipe;
    using block_type = typename Recipe::template block<T>;
    static constexpr std::string_view name = "byte_lm";
    static constexpr std::size_t vocab = data::ByteTokenizer::vocab_size;

    /// Trainable parameters of a model of this config, from the recipe's shapes (no allocation; in
    /// double: sizes asked for may be far beyond 2^64 bytes).
    static double parameter_count(const ByteLMConfig& c) {
        const double F = double(c.features);
        return double(c.depth) * Recipe::parameters_per_block(F) + 2 * double(vocab) * F;
    }

    /// Bytes a training run needs at its peak, roughly: per parameter its value and gradient (fp32),
    /// AdamW's two moments (fp64) and a checkpoint save's copies (64 B in all); per token the
    /// recipe's activations and the logits' chunk (3 floats per vocabulary entry).
    static double estimated_training_bytes(const ByteLMConfig& c, std::size_t batch, std::size_t sequence) {
        const double tokens = double(batch) * double(sequence);
        return 64 * parameter_count(c) + 4 * Recipe::activation_floats_per_token_feature * tokens * double(c.features) +
               12 * tokens * double(vocab);
    }

    /// Refuses, before anything is allocated, a sequence length the block cannot take and a model
    /// and batch that do not fit in the memory this machine has free (a clear error instead of
    /// std::bad_alloc or the OOM killer).
    static void check_trainable(const ByteLMConfig& c, std::size_t batch, std::size_t sequence) {
        check<config::config_error>(sequence % Recipe::sequence_multiple == 0, "config: key 'sequence' must be a multiple of ",
                                    Recipe::sequence_multiple, " (", Recipe::description, "), got ", sequence);
        const double need = estimated_training_bytes(c, batch, sequence);
        const std::size_t available = memory::available_bytes();
        check<config::config_error>(available == 0 || need <= double(available), "config: the model (features ", c.features, ", depth ",
                                    c.depth, ": ", parameter_count(c), " parameters) with batch ", batch, " x sequence ", sequence,
                                    " needs about ", olmax::detail::human_bytes(need), ", more than the ",
                                    olmax::detail::human_bytes(double(available)),
                                    " of memory available; reduce --features, --depth, --batch or --sequence");
    }

    /// The main job's model: its config's model keys, checked against its batch and sequence.
    template <ByteLMRunConfig C>
    explicit ByteLM(const C& c) : ByteLM(checked(c)) {}
    explicit ByteLM(const ByteLMConfig& c)
        : config_(c), layer_config_(layer_config(c)), rng_(c.seed), embedding(layer_config_, rng_), stack(layer_config_, rng_),
          head(layer_config_, rng_) {}

    const ByteLMConfig& config() const { return config_; }

    /// [B, S] byte ids -> [B, S, F] features.
    Tensor<T> hidden(const Tensor<std::int32_t>& ids) const {
        if constexpr (nn::InvertibleLayer<block_type>) return nn::merge_streams(stack.forward(nn::two_streams(embedding(ids))));
        else return stack.forward(embedding(ids));
    }

    /// Mean training loss (nats per byte, without the z-loss term; its gradient includes it).
    Tensor<T> loss(const data::Batch& batch) const { return head.loss(hidden(batch.inputs), batch.targets); }

    /// Recompute as a budget, chosen (the config key `kept_layers`): `kept` >= 0 keeps that many
    /// leading layers' activations (nn::Stack::keep_activations); -1 keeps as many as fit half of
    /// the memory available (memory::available_bytes) beyond the model's own estimate
    /// (`estimated_training_bytes`), measured per layer for one shard of `batch` x `sequence`
    /// (each of `shards` threads keeps its own): the fastest step that leaves the machine half its
    /// memory. Returns how many layers keep their activations (0 for a block that is not reversible:
    /// its stack keeps every layer's anyway).
    std::size_t keep_activations(std::int64_t kept, std::size_t batch, std::size_t sequence, std::size_t shards) {
        check<value_error>(kept >= -1, "ByteLM::keep_activations: kept layers must be -1 (chosen from memory) or >= 0, got ", kept);
        if constexpr (!nn::InvertibleLayer<block_type>) {
            return 0;
        } else {
            if (kept >= 0) {
                stack.keep_activations(std::size_t(kept));
                return stack.kept_activations();
            }
            const double free = double(memory::available_bytes()) - estimated_training_bytes(config_, batch, sequence);
            if (free <= 0) {
                stack.keep_activations(0);
                return 0;
            }
            shards = std::clamp<std::size_t>(shards, 1, std::max<std::size_t>(batch, 1));
            const std::size_t rows = (batch + shards - 1) / shards;  // the largest shard
            Tensor<T> probe;
            {
                autodiff::no_grad off;
                probe = nn::two_streams(Tensor<T>({rows, sequence, config_.features}, T(0.01)));
            }
            return stack.fit_activations(std::size_t(free / 2 / double(shards)), probe);
        }
    }

    /// Forward and backward of the training loss on `batch`, gradients (times `scale`, e.g.
    /// 1 / grad_accumulation) added to the parameters; returns the batch's mean loss. With
    /// `shards` > 1 the batch's rows are split into that many shards differentiated at the same time
    /// on the host kernels' threads (autodiff::data_parallel_backward): each shard's loss is weighted
    /// by its share of the rows, so the sum is the batch mean and the gradient equals the one-shard
    /// gradient up to rounding (deterministic for a given shard count).
    double accumulate_gradients(const data::Batch& batch, std::size_t shards, double scale) {
        const std::size_t rows = batch.inputs.shape()[0];
        shards = std::clamp<std::size_t>(shards, 1, rows);
        if (shards == 1) {
            autodiff::tape_scope tape;
            auto batch_loss = loss(batch);
            const double value = double(batch_loss.item());
            if (scale != 1.0) batch_loss = batch_loss * T(scale);
            batch_loss.backward();
            return value;
        }
        std::vector<Tensor<T>> tensors;
        for (const auto& p : parameters()) tensors.push_back(p.tensor);
        std::vector<double> shard_means(shards);  // each shard writes its own slot
        auto share = [&](std::size_t s) { return double(rows * (s + 1) / shards - rows * s / shards) / double(rows); };
        autodiff::data_parallel_backward<T>(tensors, shards, [&](std::size_t s) {
            const auto shard_loss = loss(data::batch_rows(batch, rows * s / shards, rows * (s + 1) / shards));
            shard_means[s] = double(shard_loss.item());
            return shard_loss * T(scale * share(s));
        });
        double value = 0;
        for (std::size_t s = 0; s < shards; ++s) value += shard_means[s] * share(s);
        return value;
    }

    /// Sum of -log p(target) over real (mask 1) targets and their count, without recording.
    std::pair<double, double> masked_nll(const data::Batch& batch) const {
        autodiff::no_grad guard;
        const auto logits = head.logits(hidden(batch.inputs));
        const std::size_t V = logits.shape().back(), n = batch.targets.size();
        double total = 0, count = 0;
        for (std::size_t i = 0; i < n; ++i) {
            if (batch.mask.data()[i] == 0.0f) continue;
            total += next_byte_loss(logits.data() + i * V, V, std::size_t(batch.targets.data()[i]));
            count += 1;
        }
        return {total, count};
    }

    /// The parameter walk: "embedding/...", "stack/*/..." (stacked over depth), "head/...".
    void visit_parameters(nn::ParameterVisitor<T>& visit) {
        visit.child(decltype(embedding)::name, embedding);
        visit.child(decltype(stack)::name, stack);
        visit.child(decltype(head)::name, head);
    }

    /// Every trainable tensor as the optimiser sees it (optim::parameters_of).
    std::vector<optim::Parameter<T>> parameters() { return optim::parameters_of(*this); }

    /// Next-byte logits after `context` (right-aligned in a window of `sequence` bytes, padded on
    /// the left with end-of-document bytes, which is how every document starts in training).
    std::vector<T> next_logits(const std::vector<std::uint8_t>& context, std::size_t sequence) const {
        autodiff::no_grad guard;
        auto ids = Tensor<std::int32_t>({1, sequence}, std::int32_t(data::ByteTokenizer::end_of_document));
        const std::size_t take = std::min(context.size(), sequence);
        for (std::size_t i = 0; i < take; ++i) ids.data()[sequence - take + i] = context[context.size() - take + i];
        const auto logits = head.logits(hidden(ids));
        const std::size_t V = logits.shape().back();
        const T* last = logits.data() + (sequence - 1) * V;
        return std::vector<T>(last, last + V);
    }

    /// Whether the blocks continue a sequence from a carried state (nn::ContinuableLayer: the
    /// qrnn, mamba, mamba2, gated_deltanet, attention and hybrid recipes): then `sample` decodes with a
    /// Decoder; otherwise it runs the window again for every byte (`next_logits`).
    static constexpr bool decodes_stepwise = nn::ContinuableLayer<nn::Stack<block_type>>;
    /// Whether `sample` with `decoding` runs a Decoder (else the window, for every byte).
    static constexpr bool steps_with(Decoding decoding) { return decodes_stepwise && decoding == Decoding::stepwise; }

    /// Next-byte logits over a growing context, each byte run through the layers once: the blocks
    /// carry their state from one byte to the next (nn::continue_sequence: recurrent states,
    /// convolution tails, attention's keys and values), so a byte costs one step of every layer
    /// instead of a window of `sequence` steps. The layers see the bytes appended since the
    /// decoder's last start (`window()`), and the logits are those of the whole model run on that
    /// window (up to rounding). The window holds at most `sequence` bytes, the length the model was
    /// trained on: a byte that would overflow it starts the decoder again from the last
    /// ceil(sequence / 2) bytes of the context, as a training row starts from zero state anywhere in
    /// the stream. So every byte is predicted from between sequence / 2 and sequence of the bytes
    /// before it (next_logits: always `sequence`, padded), at about two steps per byte.
    class Decoder {
    public:
        Decoder(const ByteLM& model, std::size_t sequence)
            requires decodes_stepwise
            : model_(&model), sequence_(sequence) {
            check<value_error>(sequence > 0, "models::ByteLM::Decoder: the window (sequence) must be positive");
        }

        /// Appends `bytes` (at least one) to the context; returns the logits of the byte after them.
        std::vector<T> append(std::span<const std::uint8_t> bytes) {
            check<value_error>(!bytes.empty(), "models::ByteLM::Decoder::append: no bytes given");
            context_.insert(context_.end(), bytes.begin(), bytes.end());
            if (window_.size() + bytes.size() <= sequence_) {
                window_.insert(window_.end(), bytes.begin(), bytes.end());
                return run(bytes);
            }
            const std::size_t keep = std::min(context_.size(), (sequence_ + 1) / 2);
            const std::vector<std::uint8_t> restart(context_.end() - std::ptrdiff_t(keep), context_.end());
            states_ = {};
            window_ = restart;
            if (context_.size() > sequence_) context_.erase(context_.begin(), context_.end() - std::ptrdiff_t(sequence_));
            return run(restart);
        }
        std::vector<T> append(std::uint8_t byte) { return append(std::span<const std::uint8_t>(&byte, 1)); }

        /// The bytes the layers have run since the decoder's last start, oldest first.
        const std::vector<std::uint8_t>& window() const { return window_; }

    private:
        std::vector<T> run(std::span<const std::uint8_t> bytes) {
            autodiff::no_grad guard;
            auto ids = Tensor<std::int32_t>::uninitialized({1, bytes.size()});
            std::copy(bytes.begin(), bytes.end(), ids.data());
            const auto& m = *model_;
            const Tensor<T> x = m.embedding(ids);
            Tensor<T> h;
            if constexpr (nn::InvertibleLayer<block_type>) h = nn::merge_streams(m.stack.continue_sequence(nn::two_streams(x), states_));
            else h = m.stack.continue_sequence(x, states_);
            const auto logits = m.head.logits(slice(h, 1, bytes.size() - 1, bytes.size()));
            return std::vector<T>(logits.data(), logits.data() + logits.size());
        }

        const ByteLM* model_;
        std::size_t sequence_;
        std::vector<std::uint8_t> context_, window_;  // context_: the last `sequence` bytes at most
        typename nn::Stack<block_type>::sequence_state states_;
    };

    /// `count` sampled bytes continuing `prompt` (stops early at an end-of-document byte).
    std::string sample(const std::string& prompt, std::size_t count, std::size_t sequence, const data::SamplingConfig& sampling,
                       Generator& sampler, Decoding decoding = Decoding::stepwise) const {
        std::string out;
        sample(
            prompt, count, sequence, sampling, sampler,
            [&](char byte) {
                out.push_back(byte);
                return true;
            },
            decoding);
        return out;
    }

    /// The same bytes, each handed to `on_byte` as soon as it is drawn (a program prints them as
    /// they come); sampling also stops when `on_byte` returns false. Returns how many were drawn.
    template <class OnByte>
        requires std::predicate<OnByte&, char>
    std::size_t sample(const std::string& prompt, std::size_t count, std::size_t sequence, const data::SamplingConfig& sampling,
                       Generator& sampler, OnByte&& on_byte, Decoding decoding = Decoding::stepwise) const {
        std::vector<std::uint8_t> context = data::ByteTokenizer::encode(prompt);
        context.insert(context.begin(), data::ByteTokenizer::end_of_document);
        std::optional<Decoder> decoder;  // stepwise; else the window runs again for every byte
        std::vector<T> logits;
        if constexpr (decodes_stepwise)
            if (steps_with(decoding)) logits = decoder.emplace(*this, sequence).append(context);
        std::size_t drawn = 0;
        for (std::size_t i = 0; i < count; ++i) {
            if (!decoder) logits = next_logits(context, sequence);
            const auto byte = std::uint8_t(data::sample_token(std::span<const T>(logits), sampling, sampler));
            if (byte == data::ByteTokenizer::end_of_document) break;
            context.push_back(byte);
            ++drawn;
            if (!on_byte(char(byte))) break;
            if constexpr (decodes_stepwise)
                if (decoder && i + 1 < count) logits = decoder->append(byte);
        }
        return drawn;
    }

    /// How well the model predicts `document` the way `sample` reads a text: each of its bytes, then
    /// the end-of-document byte after it, from the end-of-document byte that starts every document
    /// and the bytes before it, run as `decoding` says (the Decoder's context of sequence / 2 to
    /// `sequence` bytes, or the window's `sequence`, padded). Cross-entropy of the softmax, without
    /// the training loss's z-loss term; the logits are computed as `sample`'s are.
    TextScore score(std::span<const std::uint8_t> document, std::size_t sequence, Decoding decoding = Decoding::stepwise) const {
        check<value_error>(sequence > 0, "models::ByteLM::score: the window (sequence) must be positive");
        constexpr auto end = data::ByteTokenizer::end_of_document;
        std::vector<std::uint8_t> context{end};
        std::optional<Decoder> decoder;  // as in sample: stepwise, else the window for every byte
        std::vector<T> logits;
        if constexpr (decodes_stepwise)
            if (steps_with(decoding)) logits = decoder.emplace(*this, sequence).append(context);
        TextScore total;
        for (std::size_t i = 0; i <= document.size(); ++i) {
            const std::uint8_t target = i < document.size() ? document[i] : end;
            if (!decoder) logits = next_logits(context, sequence);
            total.nats += next_byte_loss(logits.data(), logits.size(), target);
            ++total.predictions;
            if (i == document.size()) break;
            if constexpr (decodes_stepwise)
                if (decoder) logits = decoder->append(target);
            if (!decoder) {
                context.push_back(target);
                if (context.size() >= 2 * sequence) context.erase(context.begin(), context.end() - std::ptrdiff_t(sequence));
            }
        }
        return total;
    }

private:
    /// -log softmax(logits)[target] of one row of `vocab_size` logits, in double.
    static double next_byte_loss(const T* logits, std::size_t vocab_size, std::size_t target) {
        double top = double(logits[0]);
        for (std::size_t v = 1; v < vocab_size; ++v) top = std::max(top, double(logits[v]));
        double sum = 0;
        for (std::size_t v = 0; v < vocab_size; ++v) sum += std::exp(double(logits[v]) - top);
        return top + std::log(sum) - double(logits[target]);
    }

    template <ByteLMRunConfig C>
    static ByteLMConfig checked(const C& c) {
        const auto model = ByteLMConfig::from(c);
        check<config::config_error>(c.block == Recipe::key, "config: key 'block' is '", c.block, "' but this model is built from the '",
                                    Recipe::key, "' recipe (models::with_recipe picks the type for a block name)");
        check<config::config_error>(c.batch > 0 && c.sequence > 0, "config: keys 'batch' and 'sequence' must be positive, got ", c.batch,
                                    " and ", c.sequence);
        check_trainable(model, std::size_t(c.batch), std::size_t(c.sequence));
        return model;
    }

    /// The blocks' config (nn::Config, or one derived from it such as nn::MoEConfig); the embedding
    /// and the head take its nn::Config part.
    using layer_config_type = typename nn::Stack<block_type>::config_type;

    static layer_config_type layer_config(const ByteLMConfig& c) {
        check<value_error>(c.features > 0 && c.depth > 0, "models::ByteLM: features and depth must be positive, got ", c.features, " and ",
                           c.depth);
        layer_config_type n;
        n.features = c.features;
        n.depth = c.depth;
        n.vocab = vocab;
        n.seed = c.seed;
        if constexpr (requires { Recipe::experts; }) n.experts = Recipe::experts;
        return n;
    }

    ByteLMConfig config_;
    layer_config_type layer_config_;
    Generator rng_;

public:
    // The parts, public for benchmarks and tests that time or probe one of them.
    nn::Embedding<T> embedding;
    nn::Stack<block_type> stack;
    nn::OutputHead<T> head;
};

}  // namespace olmax::models
