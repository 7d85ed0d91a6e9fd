#pragma once
// The layer contract of olmax::nn, written once and checked at compile time.
//
// A *layer* (the "details" type, dlib/LibTorch style) is a plain copyable value type that owns its
// parameters as `Tensor<T>` handles. It must provide:
//
//   using value_type  = float | double;                  // element type of inputs, outputs, parameters
//   using config_type = olmax::nn::Config;               // what it is built from (usually nn::Config)
//   static constexpr std::string_view name = "dense";    // its scope in hierarchical parameter names
//   Layer(const config_type&, olmax::Generator&);        // construct + initialise from a config
//   Tensor<T> forward(const Tensor<T>& x, const LayerContext&) const;   // differentiable forward
//   void visit_parameters(ParameterVisitor<T>&);         // every parameter, with name and role
//
// Ensures: forward records on the tape with ordinary ops (or a custom op), is deterministic for fixed
// parameters and context, and adds (never assigns) gradients into its parameters. visit_parameters
// visits the same parameters in the same order on every call (names are the checkpoint keys and the
// reversible recompute relies on it); a wrapper may rebind the visited handles (Stack binds each
// layer's slice of its stacked parameters that way).
//
// Optional (detected, never required):
//   * `inverse(y, ctx)` and `reverse(y, dy, ctx) -> {x, dx}` plus `memory_saving()`: an *invertible*
//     layer (nn::Reversible); its custom backward rebuilds the input from the output, so containers
//     keep no activations for it (InvertibleLayer).
//   * Parameter serialisation is not a per-layer member: io::save_parameters / load_parameters work
//     for every conforming layer through visit_parameters (see olmax/io/parameters.hpp).
//
// A thin user-facing wrapper (`nn::Module<L>`, `nn::Stack`, `nn::Sequential`) owns a layer and adds
// `operator()`, parameter listing and zero_grad (files: io::save_parameters / load_parameters).

#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "olmax/core/random.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/nn/role.hpp"

namespace olmax::nn {

/// Inside an nn::Stack: one copy per layer (stored with a leading depth axis) or one copy shared
/// by every layer (the original's weight-tied MoE expert).
enum class Sharing { per_layer, tied };

/// Runtime information a layer gets with every forward call.
struct LayerContext {
    std::size_t layer_index = 0;  ///< position in the enclosing Stack (the mixer alternates modes by it)
    std::size_t depth = 1;        ///< number of layers in the enclosing Stack
    bool recompute = false;       ///< true while a reversible backward re-runs the forward (side effects such as
                                  ///< auxiliary losses must not be recorded twice)
    bool training = true;         ///< dropout and other training-only behaviour on
    /// Seed of this call's random numbers (dropout). Containers derive a distinct seed per child
    /// (`child_context`), so the draws are a pure function of (seed, position): a reversible
    /// recompute replays exactly the same random numbers without saving any generator state.
    /// Pass a different seed per training step.
    std::uint64_t random_seed = 0;
};

/// SplitMix64 finaliser (Steele et al. 2014): mixes a seed with a child index.
inline std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t child) {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (child + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/// The context a container hands to its child number `child` (its own seed, same everything else).
inline LayerContext child_context(const LayerContext& ctx, std::size_t child) {
    LayerContext c = ctx;
    c.random_seed = mix_seed(ctx.random_seed, child);
    return c;
}

/// After how many consecutive layer indices a layer's behaviour repeats, for an input of
/// `input_shape`. A layer whose forward reads `LayerContext::layer_index` declares it with a member
/// `std::size_t layer_period(const Shape& input_shape) const` (the hierarchical mixer: its number of
/// modes); every other layer's is 1. A traced nn::Stack runs its layers as one loop of `period`
/// layers per iteration (olmax/trace/layer_loop.hpp), so this is what keeps a traced program right.
template <class L>
std::size_t layer_period(const L& layer, const Shape& input_shape) {
    if constexpr (requires { { layer.layer_period(input_shape) } -> std::convertible_to<std::size_t>; }) return layer.layer_period(input_shape);
    else return 1;
}

/// The context nn::Stack hands to layer `layer` of `depth`.
inline LayerContext layer_context(const LayerContext& ctx, std::size_t layer, std::size_t depth) {
    LayerContext c = child_context(ctx, layer);
    c.layer_index = layer;
    c.depth = depth;
    return c;
}

/// One configuration shared by every layer, like the original's single context object. Fields a
/// layer does not use are ignored; every layer validates the ones it uses and throws naming itself.
/// A layer with settings of its own derives its config from this one (nn::MoEConfig in
/// olmax/nn/moe.hpp), and a container of layers is built from the most derived of its parts'
/// configs (shared_config_t).
struct Config {
    /// F: width of the residual stream. No default: 0 means "not set", and every layer built from
    /// a config refuses it, naming itself (`checked_features`).
    std::size_t features = 0;
    std::size_t hidden_features = 0;    ///< inner width of DenseConv; 0 means 2F (the original dense block)
    std::size_t vocab = 256;            ///< V: embedding rows / output classes (bytes)
    std::size_t depth = 0;              ///< layers of an nn::Stack built from a config alone (no default: 0 is refused there)
    std::size_t conv_groups = 1;        ///< groups of CausalConv
    double norm_eps = 1e-16;            ///< ScaleNorm: x / max(||x||, eps)
    double rms_eps = 1e-6;              ///< RMSNorm epsilon
    double leaky_slope = 0.01;          ///< leaky-ReLU slope (the original's 0.01)
    double dropout = 0;                 ///< nn::Dropout drop probability, in [0, 1)
    double momentum_beta = 0.5;         ///< MomentumNet coupling beta (in (0, 1])
    bool bias = false;                  ///< Linear / CausalConv with bias (the original has none)
    bool reversible_backward = true;    ///< false: same maths, but every activation stays on the tape
    double z_loss = 0.01;               ///< output head z-loss
    std::size_t loss_chunk_tokens = 1024;  ///< output head tokens per loss chunk
    std::uint64_t seed = 0;             ///< wrappers built without a Generator seed one from this

    std::size_t hidden() const { return hidden_features ? hidden_features : 2 * features; }

    /// `features`, or value_error naming `layer` and the fix when it was not set.
    std::size_t checked_features(std::string_view layer) const {
        check<value_error>(features > 0, layer, ": nn::Config::features is 0 (not set); give the width of the residual stream, "
                                                "e.g. nn::Config{.features = 256}");
        return features;
    }
};

namespace detail {
template <class A, class B>
using wider_config_t = std::conditional_t<std::is_same_v<A, B> || std::is_base_of_v<A, B>, B, std::conditional_t<std::is_base_of_v<B, A>, A, void>>;
template <class... Cs>
struct widest_config;
template <class C>
struct widest_config<C> {
    using type = C;
};
template <class A, class B, class... Rest>
struct widest_config<A, B, Rest...> : widest_config<wider_config_t<A, B>, Rest...> {};
template <class B, class... Rest>
struct widest_config<void, B, Rest...> {
    using type = void;
};
}  // namespace detail

/// The config a container of the layers Ls... is built from: the one of their config types that
/// derives from all the others (Sequential<RMSNorm, MoE>: nn::MoEConfig, an nn::Config with the
/// router's fields), so one object builds every part; void when no such type exists.
template <class... Ls>
using shared_config_t = typename detail::widest_config<typename Ls::config_type...>::type;

/// Walks a layer's parameters: `visit("weight", weight_, Role::weight)` for its own and
/// `visit.child("conv0", conv0_)` for a sub-layer, which prefixes the names ("dense/conv0/weight").
template <Real T>
class ParameterVisitor {
public:
    using Sink = std::function<void(const std::string& name, Tensor<T>& tensor, Role role, Sharing sharing)>;

    explicit ParameterVisitor(Sink sink, std::string prefix = {}) : sink_(std::move(sink)), prefix_(std::move(prefix)) {}

    void operator()(std::string_view name, Tensor<T>& tensor, Role role, Sharing sharing = Sharing::per_layer) {
        sink_(join(name), tensor, role, sharing);
    }

    template <class Child>
    void child(std::string_view name, Child& layer) {
        ParameterVisitor sub(sink_, join(name));
        layer.visit_parameters(sub);
    }

    const std::string& prefix() const { return prefix_; }

private:
    std::string join(std::string_view name) const {
        if (prefix_.empty()) return std::string(name);
        if (name.empty()) return prefix_;
        return prefix_ + "/" + std::string(name);
    }

    Sink sink_;
    std::string prefix_;
};

namespace detail {

template <class L>
concept declares_value_type = requires { typename L::value_type; } && Real<typename L::value_type>;
template <class L>
concept declares_config_type = requires { typename L::config_type; };
template <class L>
concept declares_name = requires {
    { L::name } -> std::convertible_to<std::string_view>;
};
template <class L>
concept constructible_from_config = std::constructible_from<L, const typename L::config_type&, Generator&>;
template <class L>
concept has_forward = requires(const L& layer, const Tensor<typename L::value_type>& x, const LayerContext& ctx) {
    { layer.forward(x, ctx) } -> std::same_as<Tensor<typename L::value_type>>;
};
template <class L>
concept has_parameters = requires(L& layer, ParameterVisitor<typename L::value_type>& visit) { layer.visit_parameters(visit); };

}  // namespace detail

/// The layer contract (see the top of this file).
template <class L>
concept Layer = detail::declares_value_type<L> && detail::declares_config_type<L> && detail::declares_name<L> &&
                detail::constructible_from_config<L> && detail::has_forward<L> && detail::has_parameters<L> &&
                std::copy_constructible<L>;

/// A layer whose input can be rebuilt from its output, with its own memory-free backward:
/// `reverse(y, dy, ctx)` returns `{x, dx}` and adds parameter gradients (nn::Reversible).
template <class L>
concept InvertibleLayer = Layer<L> && requires(const L& layer, const Tensor<typename L::value_type>& y, const LayerContext& ctx) {
    { layer.inverse(y, ctx) } -> std::same_as<Tensor<typename L::value_type>>;
    { layer.reverse(y, y, ctx) } -> std::same_as<std::pair<Tensor<typename L::value_type>, Tensor<typename L::value_type>>>;
    { layer.memory_saving() } -> std::convertible_to<bool>;
};

/// Checks the layer contract one requirement at a time, so a non-conforming type gets one
/// plain-English message naming the missing piece. Every wrapper calls it on its template
/// arguments: `static_assert(nn::assert_layer<Inner>());`.
template <class L>
consteval bool assert_layer() {
    static_assert(detail::declares_value_type<L>,
                  "olmax::nn layer contract: the layer type must declare `using value_type = float;` or `double` (its element type)");
    if constexpr (detail::declares_value_type<L>) {
        static_assert(detail::declares_config_type<L>,
                      "olmax::nn layer contract: the layer type must declare `using config_type = ...;` (usually olmax::nn::Config)");
        if constexpr (detail::declares_config_type<L>) {
            static_assert(detail::declares_name<L>,
                          "olmax::nn layer contract: the layer type must declare `static constexpr std::string_view name` (its scope in parameter names)");
            static_assert(detail::constructible_from_config<L>,
                          "olmax::nn layer contract: the layer type must be constructible from (const config_type&, olmax::Generator&)");
            static_assert(detail::has_forward<L>,
                          "olmax::nn layer contract: the layer type must have `Tensor<value_type> forward(const Tensor<value_type>&, "
                          "const LayerContext&) const`");
            static_assert(detail::has_parameters<L>,
                          "olmax::nn layer contract: the layer type must have `void visit_parameters(ParameterVisitor<value_type>&)`");
            static_assert(std::copy_constructible<L>, "olmax::nn layer contract: the layer type must be copy constructible");
        }
    }
    return Layer<L>;
}

}  // namespace olmax::nn
