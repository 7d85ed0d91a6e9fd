#pragma once
// Causal multi-head self-attention, D -> D:
//
//     [q, k, v] = x W_qkv                      D -> (H + 2 Hkv) Dh, one GEMM
//     q, k      = RMSNorm over Dh (optional qk-norm), then RoPE (olmax/ops/rope.hpp)
//     a         = causal_attention(q, k, v)    olmax/ops/attention.hpp: blocked, O(T) memory, exact backward
//     out       = a W_out                      H Dh -> D
//
// Grouped-query attention when kv_heads < heads. Packed documents: the optional resets [batch, T]
// (nonzero at the first position of a document) keep every query inside its document and restart
// the rotary positions there, so a packed row gives each document the outputs it would get alone.
// Traced (a program for XLA) it runs the ops' traced forms: attention with its T x T scores
// materialised, and RoPE with its positions computed in the program from host or traced resets.
//
// Decoding (continue_sequence, nn::continue_sequence): the state is the keys and values of every
// step seen so far (after qk-norm and RoPE, a KV cache); the new steps' queries attend to them and
// to their own keys (causal_attention with fewer queries than keys), at RoPE positions that go on
// from the cache's length. Inference only: causal_attention refuses that form where a gradient
// would be recorded. The cache keeps its keys and values in buffers with room to grow (the room
// doubles when it runs out, like std::vector's), so a step writes its own keys and values and
// copies none of the earlier ones: with a copy of every cached key per step, decoding T steps
// would move O(T^2) bytes and allocate a buffer of a new size every step. With a sliding window W
// no later query sees a key more than W - 1 steps back, so when the buffers are full the cache
// first drops all but its last W - 1 keys (moving them to the front: W - 1 rows once per at
// least W steps) and grows only if the new steps still do not fit; a long prompt's buffers shrink
// at the first drop. Decoding with a window holds about 2 W keys however long it runs.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <string_view>

#include "olmax/core/random.hpp"
#include "olmax/nn/contract.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/ops/attention.hpp"
#include "olmax/ops/linalg.hpp"
#include "olmax/ops/norm.hpp"
#include "olmax/ops/rope.hpp"
#include "olmax/ops/shape.hpp"

namespace olmax::nn {

/// Sizes and options of nn::CausalSelfAttention.
struct AttentionConfig {
    std::size_t features = 256;    ///< D: width of the residual stream
    std::size_t heads = 0;         ///< H: query heads; 0 means D / 64 when 64 divides D, else 1
    std::size_t kv_heads = 0;      ///< Hkv: key/value heads, dividing H; 0 means H (no grouping)
    std::size_t head_dim = 0;      ///< Dh; 0 means D / H (then H must divide D)
    std::size_t window = 0;        ///< sliding window W: query t sees keys (t - W, t]; 0 means all keys s <= t
    double rope_base = 10000;      ///< RoPE base; 0 turns RoPE off
    bool qk_norm = false;          ///< RMSNorm over Dh of q and k (one scale [Dh] each) before RoPE
    double qk_norm_eps = 1e-6;
    std::size_t query_tile = 64;   ///< tiles of causal_attention
    std::size_t key_tile = 128;

    std::size_t head_count() const { return heads ? heads : (features >= 64 && features % 64 == 0 ? features / 64 : 1); }
    std::size_t kv_head_count() const { return kv_heads ? kv_heads : head_count(); }
    std::size_t head_size() const { return head_dim ? head_dim : features / head_count(); }
};

template <Real T>
class CausalSelfAttention;

/// The keys and values nn::CausalSelfAttention has seen, [batch, held, Hkv, Dh] each (a KV cache;
/// default-constructed: none): every step's, or under a sliding window W at least the last W - 1
/// steps' (older ones, which no later query can see, are dropped when the buffers are full). It
/// holds them in buffers [batch, capacity, Hkv, Dh] with room for later steps; a copy of a cache
/// copies its keys and values (decoding from it does not change the original), a move does not.
template <Real T>
class AttentionCache {
public:
    AttentionCache() = default;
    /// A cache that starts from these keys and values [batch, steps, Hkv, Dh] (they are not
    /// written to: the first step after them moves them into a larger buffer).
    AttentionCache(Tensor<T> keys, Tensor<T> values)
        : k_(std::move(keys)), v_(std::move(values)), steps_(k_.defined() ? k_.extent(1) : 0), held_(steps_) {}
    AttentionCache(const AttentionCache& other) : steps_(other.steps_), held_(other.held_), owned_(true) {
        if (other.k_.defined()) k_ = other.k_.clone(), v_ = other.v_.clone();
    }
    AttentionCache(AttentionCache&&) noexcept = default;
    AttentionCache& operator=(const AttentionCache& other) {
        if (this != &other) *this = AttentionCache(other);
        return *this;
    }
    AttentionCache& operator=(AttentionCache&&) noexcept = default;

    /// Steps seen: the RoPE position of the next step.
    std::size_t steps() const { return steps_; }
    /// Steps whose keys and values are held: steps(), or fewer under a sliding window.
    std::size_t held() const { return held_; }
    /// Room for steps before the buffers grow.
    std::size_t capacity() const { return k_.defined() ? k_.extent(1) : 0; }
    /// The held keys and values, [batch, held, Hkv, Dh] (undefined when none).
    Tensor<T> keys() const { return seen(k_); }
    Tensor<T> values() const { return seen(v_); }

private:
    friend class CausalSelfAttention<T>;
    Tensor<T> seen(const Tensor<T>& buffer) const { return held_ == capacity() ? buffer : slice(buffer, 1, 0, held_); }
    /// The keys' shape as [batch, held, Hkv, Dh] (the buffer's, with the held steps for its room).
    Shape shape() const {
        Shape shape = k_.shape();
        if (shape.size() > 1) shape[1] = held_;
        return shape;
    }

    /// Writes the new steps' keys and values [batch, t, Hkv, Dh] after the held ones and returns
    /// the steps then held. When the buffers are full, a sliding window (> 0) first drops all but
    /// the last window - 1 held steps (they are all a later query can see). If the steps still do
    /// not fit, the buffers grow to twice their room, or twice what is kept when that is less; if
    /// they fit in a quarter of the room after a drop (a long prompt's buffers), the buffers
    /// shrink to twice what they need. held() and steps() move on only with commit(), so that a
    /// refused call changes no result (a drop is done at once: it only forgets unseeable keys).
    std::size_t write(const Tensor<T>& k, const Tensor<T>& v, std::size_t window) {
        const std::size_t nb = k.extent(0), nt = k.extent(1), room = capacity();
        const bool full = held_ + nt > room;
        const std::size_t keep = full && window > 0 ? std::min(held_, window - 1) : held_, first = held_ - keep, need = keep + nt;
        std::size_t new_room = room;
        if (need > room) new_room = std::max(need, 2 * std::min(room, need));
        else if (first > 0 && room > 4 * need) new_room = 2 * need;
        // Buffers the cache did not make (given keys, the first call's own k and v, which its
        // gradient may have saved) are never written: a drop moves their rows into new ones.
        if (new_room != room || (first > 0 && !owned_)) {
            const Shape shape{nb, new_room, k.extent(2), k.extent(3)};
            Tensor<T> k2 = Tensor<T>::uninitialized(shape), v2 = Tensor<T>::uninitialized(shape);
            if (keep > 0) copy_steps(k_, first, keep, k2), copy_steps(v_, first, keep, v2);
            k_ = std::move(k2), v_ = std::move(v2), owned_ = true;
        } else if (first > 0) {
            copy_steps(k_, first, keep, k_), copy_steps(v_, first, keep, v_);  // in place, to the front
        }
        held_ = keep;
        copy_steps(k, 0, nt, k_, held_), copy_steps(v, 0, nt, v_, held_);
        return need;
    }
    void commit(std::size_t held, std::size_t new_steps) { held_ = held, steps_ += new_steps; }
    /// The first call's keys and values, held as they are.
    void start(Tensor<T> k, Tensor<T> v) {
        const std::size_t nt = k.extent(1);
        k_ = std::move(k), v_ = std::move(v), held_ = steps_ = nt, owned_ = false;
    }

    /// Steps [first, first + n) of every batch row of `from` to steps [at, at + n) of `to`. `to` may
    /// be `from` with at <= first: each row's steps then move towards its front, which std::copy's
    /// front-to-back order allows where the ranges overlap.
    static void copy_steps(const Tensor<T>& from, std::size_t first, std::size_t n, Tensor<T>& to, std::size_t at = 0) {
        const std::size_t row = from.extent(2) * from.extent(3), from_rows = from.extent(1), to_rows = to.extent(1);
        for (std::size_t b = 0; b < from.extent(0); ++b) {
            const T* source = from.data() + (b * from_rows + first) * row;
            std::copy(source, source + n * row, to.data() + (b * to_rows + at) * row);
        }
    }

    Tensor<T> k_, v_;  // [batch, capacity, Hkv, Dh]; steps [0, held_) are the cache's
    std::size_t steps_ = 0;  // steps seen (RoPE's next position)
    std::size_t held_ = 0;   // steps held: the last held_ of the steps_ seen
    bool owned_ = false;     // k_ and v_ were allocated by the cache, so it may write all of them
};

/// Causal self-attention with RoPE, D -> D (see the top of this file). Parameters (names as
/// visited): qkv/weight [D, (H + 2 Hkv) Dh], with qk_norm q_norm/scale and k_norm/scale [Dh], and
/// out_proj/weight [H Dh, D].
template <Real T = float>
class CausalSelfAttention {
public:
    using value_type = T;
    using config_type = Config;
    static constexpr std::string_view name = "causal_self_attention";

    /// features -> features with every other size at AttentionConfig's defaults.
    CausalSelfAttention(const Config& config, Generator& rng)
        : CausalSelfAttention(AttentionConfig{.features = config.checked_features("nn::CausalSelfAttention")}, rng) {}

    /// Projections fan-in normal; qk-norm scales 1.
    CausalSelfAttention(const AttentionConfig& config, Generator& rng) : config_(config) {
        constexpr std::string_view layer = "nn::CausalSelfAttention";
        const std::size_t D = config.features, H = config.head_count(), Hkv = config.kv_head_count();
        check<value_error>(D > 0, layer, ": features must be positive");
        check<value_error>(config.head_dim > 0 || D % H == 0, layer, ": ", H, " heads do not divide ", D,
                           " features; set head_dim or a head count that divides features");
        const std::size_t Dh = config.head_size();
        check<value_error>(Dh > 0 && Hkv > 0 && H % Hkv == 0, layer, ": need head_dim > 0 and kv_heads dividing heads, got heads ", H,
                           ", kv_heads ", Hkv, ", head_dim ", Dh);
        check<value_error>(config.rope_base == 0 || (std::isfinite(config.rope_base) && config.rope_base > 0 && Dh % 2 == 0), layer,
                           ": RoPE needs a positive base and an even head_dim, got base ", config.rope_base, " and head_dim ", Dh,
                           " (rope_base = 0 turns RoPE off)");
        check<value_error>(config.query_tile > 0 && config.key_tile > 0 && config.qk_norm_eps >= 0, layer,
                           ": query_tile and key_tile must be positive and qk_norm_eps non-negative");
        qkv_ = parameter(fan_in_normal<T>({D, (H + 2 * Hkv) * Dh}, D, rng));
        if (config.qk_norm) {
            q_norm_ = parameter(Tensor<T>({Dh}, T{1}));
            k_norm_ = parameter(Tensor<T>({Dh}, T{1}));
        }
        out_proj_ = parameter(fan_in_normal<T>({H * Dh, D}, H * Dh, rng));
    }

    /// x [batch, T, D] -> [batch, T, D], each row one sequence.
    Tensor<T> forward(const Tensor<T>& x, const LayerContext& = {}) const { return run(x, {}); }

    /// Packed rows: resets [batch, T] is nonzero at the first position of every document.
    Tensor<T> forward(const Tensor<T>& x, const Tensor<T>& resets, const LayerContext& = {}) const { return run(x, resets); }

    /// The next steps of a sequence (see the top of this file): x [batch, t, D] after the
    /// cache's steps; the cache gains x's keys and values.
    using sequence_state = AttentionCache<T>;
    Tensor<T> continue_sequence(const Tensor<T>& x, sequence_state& cache, const LayerContext& = {}) const { return run(x, {}, &cache); }

    void visit_parameters(ParameterVisitor<T>& visit) {
        visit("qkv/weight", qkv_, Role::weight);
        if (config_.qk_norm) {
            visit("q_norm/scale", q_norm_, Role::norm_scale);
            visit("k_norm/scale", k_norm_, Role::norm_scale);
        }
        visit("out_proj/weight", out_proj_, Role::weight);
    }

    const AttentionConfig& config() const { return config_; }

private:
    Tensor<T> run(const Tensor<T>& x, const Tensor<T>& resets, AttentionCache<T>* cache = nullptr) const {
        const std::size_t D = config_.features, H = config_.head_count(), Hkv = config_.kv_head_count(), Dh = config_.head_size();
        check<shape_error>(x.defined() && x.rank() == 3 && x.extent(2) == D, "nn::CausalSelfAttention: expected input [batch, T, ", D,
                           "], got ", x.defined() ? to_string(x.shape()) : std::string("an undefined tensor"));
        const std::size_t nb = x.extent(0), nt = x.extent(1);
        check<value_error>(nb > 0 && nt > 0, "nn::CausalSelfAttention: input of shape ", to_string(x.shape()), " is empty (batch or T is 0)");
        if (resets.defined())
            check<shape_error>(resets.rank() == 2 && resets.extent(0) == nb && resets.extent(1) == nt, "nn::CausalSelfAttention: resets of shape ",
                               to_string(resets.shape()), " does not match [batch, T] = [", nb, ", ", nt, "]");
        const Tensor<T> qkv = matmul(x, qkv_);  // [batch, T, (H + 2 Hkv) Dh]
        Tensor<T> q = reshape(slice(qkv, 2, 0, H * Dh), Shape{nb, nt, H, Dh});
        Tensor<T> k = reshape(slice(qkv, 2, H * Dh, (H + Hkv) * Dh), Shape{nb, nt, Hkv, Dh});
        Tensor<T> v = reshape(slice(qkv, 2, (H + Hkv) * Dh, (H + 2 * Hkv) * Dh), Shape{nb, nt, Hkv, Dh});
        const std::size_t seen = cache ? cache->steps() : 0;
        if (seen > 0)
            check<shape_error>(cache->k_.rank() == 4 && cache->k_.extent(0) == nb && cache->k_.extent(2) == Hkv && cache->k_.extent(3) == Dh &&
                                   cache->v_.shape() == cache->k_.shape(),
                               "nn::CausalSelfAttention: cached keys of shape ", to_string(cache->shape()), " and values of shape ",
                               to_string(cache->v_.shape()), " do not match [batch, steps, kv_heads, head_dim] = [", nb, ", steps, ", Hkv, ", ",
                               Dh, "]");
        if (config_.qk_norm) {
            q = rms_norm(q, q_norm_, T(config_.qk_norm_eps));
            k = rms_norm(k, k_norm_, T(config_.qk_norm_eps));
        }
        if (config_.rope_base > 0) {
            const RopeOptions<T> rope_options{.base = config_.rope_base, .offset = seen, .resets = resets};
            q = rope(q, rope_options);
            k = rope(k, rope_options);
        }
        AttentionOptions<T> options{.window = config_.window, .resets = resets, .query_tile = config_.query_tile, .key_tile = config_.key_tile};
        Tensor<T> a;
        if (seen == 0) {
            a = causal_attention(q, k, v, options);
            if (cache) cache->start(k, v);  // after the attention: a refused call leaves the cache as it was
        } else {
            check<trace_error>(!k.traced() && !cache->k_.traced(),
                               "nn::CausalSelfAttention: continuing a sequence from its cached keys has no traced form; trace the whole sequence");
            options.keys = cache->write(k, v, config_.window);  // the new steps' keys and values after the held ones
            a = causal_attention(q, cache->k_, cache->v_, options);
            cache->commit(options.keys, nt);  // only now: a refused call leaves the cache's steps as they were
        }
        return matmul(reshape(a, Shape{nb, nt, H * Dh}), out_proj_);
    }

    AttentionConfig config_;
    Tensor<T> qkv_, q_norm_, k_norm_, out_proj_;
};

}  // namespace olmax::nn
