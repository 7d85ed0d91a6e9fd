// Continuing a sequence (nn::continue_sequence, olmax/nn/continuation.hpp): every continuable
// layer and container run on a sequence cut into pieces, its state carried, gives the outputs of
// one forward call on the whole (double, 1e-10); which layers and recipes continue; bad states are
// refused naming the layer; models::ByteLM::Decoder's logits are the model's on its window, and
// its window restarts from the last half when full.
#include "test_helpers.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace nn = olmax::nn;
namespace models = olmax::models;
using olmax::Tensor;

namespace {

/// Runs `layer` on x cut along `axis` into `pieces`, the state carried, and compares the joined
/// outputs with one forward call on the whole x.
template <class L>
double continued_against_whole(const L& layer, const Tensor<double>& x, const std::vector<std::size_t>& pieces, long axis = 1) {
    olmax::autodiff::no_grad off;
    const Tensor<double> whole = layer.forward(x);
    nn::sequence_state_t<L> state{};
    std::vector<Tensor<double>> outputs;
    std::size_t t = 0;
    for (std::size_t n : pieces) {
        outputs.push_back(nn::continue_sequence(layer, olmax::slice(x, axis, t, t + n), state));
        t += n;
    }
    REQUIRE(t == x.shape()[std::size_t(axis)]);
    return olmax_test::max_abs_diff(olmax::concat(outputs, axis), whole);
}

const std::vector<std::size_t> continuation_pieces{1, 1, 3, 2, 4, 1};  // 12 steps

nn::Config continuation_config(std::size_t features) {
    nn::Config c;
    c.features = features;
    c.seed = 5;
    return c;
}

}  // namespace

TEST_CASE("continue_sequence: which layers and recipes continue a sequence", "[continuation]") {
    STATIC_REQUIRE(nn::PositionWiseLayer<nn::ScaleNorm<double>>);
    STATIC_REQUIRE(nn::PositionWiseLayer<nn::Linear<double>>);
    STATIC_REQUIRE(nn::PositionWiseLayer<nn::GELU<double>>);
    STATIC_REQUIRE(nn::StatefulLayer<nn::CausalConv<3, double>>);
    STATIC_REQUIRE(nn::StatefulLayer<nn::Mamba2<double>>);
    STATIC_REQUIRE(nn::StatefulLayer<nn::CausalSelfAttention<double>>);
    STATIC_REQUIRE(nn::ContinuableLayer<nn::Sandwich<nn::GatedDeltaNet<double>>>);
    STATIC_REQUIRE(nn::ContinuableLayer<nn::Sequential<nn::Linear<double>, nn::CausalConv<2, double>>>);
    // the hierarchical mixer's strided modes read later steps of a group; the MoE's capacity counts a whole sequence
    STATIC_REQUIRE_FALSE(nn::ContinuableLayer<nn::HierarchicalMixer<4, double>>);
    STATIC_REQUIRE_FALSE(nn::ContinuableLayer<nn::Sandwich<nn::MoE<double>>>);
    STATIC_REQUIRE_FALSE(nn::ContinuableLayer<nn::Stack<models::ConvMixer::block<double>>>);
    STATIC_REQUIRE(models::ByteLM<models::Hybrid>::decodes_stepwise);
    STATIC_REQUIRE(models::ByteLM<models::Mamba2Pair>::decodes_stepwise);
    STATIC_REQUIRE(models::ByteLM<models::GatedDeltaNetMlp>::decodes_stepwise);
    STATIC_REQUIRE(models::ByteLM<models::AttentionMlp>::decodes_stepwise);
    STATIC_REQUIRE(models::ByteLM<models::Mamba>::decodes_stepwise);
    STATIC_REQUIRE(models::ByteLM<models::QrnnMlp>::decodes_stepwise);
    STATIC_REQUIRE_FALSE(models::ByteLM<models::ConvMixer>::decodes_stepwise);
    STATIC_REQUIRE_FALSE(models::ByteLM<models::SwitchMoE>::decodes_stepwise);
}

TEST_CASE("continue_sequence: each layer in pieces equals one call on the whole (double, 1e-10)", "[continuation]") {
    olmax::Generator rng(11);
    const std::size_t B = 2, T = 12, F = 8;
    const auto x = olmax::randn<double>({B, T, F}, rng);
    SECTION("convolutions") {
        CHECK(continued_against_whole(nn::CausalConv<3, double>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        CHECK(continued_against_whole(nn::CausalConv<1, double>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        CHECK(continued_against_whole(nn::DenseConv<2, double>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        // a piece shorter than the carried taps, and one longer than the whole kernel
        CHECK(continued_against_whole(nn::CausalConv<5, double>(continuation_config(F), rng), x, {2, 1, 9}) < 1e-10);
    }
    SECTION("recurrent mixers (chunks of 4 cut across the pieces)") {
        nn::Mamba2Config m{.features = F, .head_dim = 4, .state = 3, .groups = 2, .chunk = 4};
        CHECK(continued_against_whole(nn::Mamba2<double>(m, rng), x, continuation_pieces) < 1e-10);
        CHECK(continued_against_whole(nn::Sandwich<nn::Mamba2<double>>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        CHECK(continued_against_whole(nn::Sandwich<nn::GatedDeltaNet<double>>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        CHECK(continued_against_whole(nn::SelectiveSSM<double>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
        for (auto pooling : {nn::QrnnPooling::original, nn::QrnnPooling::f, nn::QrnnPooling::fo, nn::QrnnPooling::ifo}) {
            INFO("QRNN pooling " << int(pooling));
            CHECK(continued_against_whole(nn::QRNN<olmax::scan::sequential_vectorized, double>(F, 6, 3, pooling, rng), x, continuation_pieces) < 1e-10);
        }
        CHECK(continued_against_whole(nn::QRNNBlock<olmax::scan::sequential_vectorized, double>(continuation_config(F), rng), x, continuation_pieces) < 1e-10);
    }
    SECTION("attention: grouped heads, qk-norm, RoPE, a sliding window") {
        for (std::size_t window : {std::size_t{0}, std::size_t{3}}) {
            INFO("window " << window);
            const nn::AttentionConfig a{.features = F, .heads = 4, .kv_heads = 2, .head_dim = 4, .window = window, .qk_norm = true,
                                        .query_tile = 3, .key_tile = 4};
            CHECK(continued_against_whole(nn::CausalSelfAttention<double>(a, rng), x, continuation_pieces) < 1e-10);
        }
    }
    SECTION("containers: Sequential, a reversible chain, a stack of the hybrid block") {
        CHECK(continued_against_whole(nn::Sequential<nn::Linear<double>, nn::CausalConv<2, double>, nn::RMSNorm<double>>(continuation_config(F), rng),
                                      x, continuation_pieces) < 1e-10);
        const Tensor<double> streams = nn::two_streams(x);  // [2, B, T, F]: time is axis 2
        CHECK(continued_against_whole(models::GatedDeltaNetMlp::block<double>(continuation_config(F), rng), streams, continuation_pieces, 2) < 1e-10);
        nn::Config c = continuation_config(F);
        c.depth = 2;
        const nn::Stack<models::Hybrid::block<double>> stack(c, rng);
        CHECK(continued_against_whole(stack, streams, continuation_pieces, 2) < 1e-10);
        CHECK(continued_against_whole(stack, streams, {T}, 2) < 1e-10);
    }
}

TEST_CASE("continue_sequence: a stack records its parameters' gradients when gradients are on", "[continuation]") {
    olmax::Generator rng(12);
    nn::Config c = continuation_config(6);
    c.depth = 2;
    nn::Stack<models::Mamba2Pair::block<double>> stack(c, rng);
    const auto x = nn::two_streams(olmax::randn<double>({1, 5, 6}, rng));
    const auto r = olmax::randn<double>(x.shape(), rng);
    auto gradients = [&](auto&& run) {
        for (auto& p : olmax::optim::parameters_of(stack)) p.tensor.zero_grad();
        olmax::sum(olmax::mul(run(), r)).backward();
        std::vector<Tensor<double>> g;
        for (auto& p : olmax::optim::parameters_of(stack)) g.push_back(p.tensor.grad().clone());
        return g;
    };
    const auto by_forward = gradients([&] { return stack.forward(x); });
    decltype(stack)::sequence_state state;
    const auto continued = gradients([&] { return stack.continue_sequence(x, state); });
    REQUIRE(by_forward.size() == continued.size());
    for (std::size_t i = 0; i < continued.size(); ++i) {
        INFO("parameter " << i);
        REQUIRE(continued[i].defined());
        CHECK(olmax_test::max_abs_diff(continued[i], by_forward[i]) < 1e-10);
    }
}

TEST_CASE("continue_sequence: a state that does not fit the layer is refused, naming it", "[continuation]") {
    using Catch::Matchers::Contains;
    olmax::Generator rng(13);
    olmax::autodiff::no_grad off;
    const auto x = olmax::randn<double>({2, 3, 4}, rng);
    nn::CausalConv<3, double> conv(continuation_config(4), rng);
    Tensor<double> tail({1, 2, 4});  // batch 1 for an input of batch 2
    CHECK_THROWS_WITH(conv.continue_sequence(x, tail), Contains("nn::CausalConv<3>") && Contains("[1, 2, 4]"));
    nn::QRNN<olmax::scan::sequential_vectorized, double> qrnn(continuation_config(4), rng);
    nn::QRNN<olmax::scan::sequential_vectorized, double>::sequence_state cell{{}, Tensor<double>({2, 5})};  // hidden 4, not 5
    CHECK_THROWS_WITH(qrnn.continue_sequence(x, cell), Contains("nn::QRNN") && Contains("[2, 5]"));
    CHECK_FALSE(cell.conv.defined());  // refused before anything moved
    nn::CausalSelfAttention<double> attention(continuation_config(4), rng);
    nn::AttentionCache<double> cache(Tensor<double>({2, 5, 3, 4}), Tensor<double>({2, 5, 3, 4}));  // 3 kv heads, not 1
    CHECK_THROWS_WITH(attention.continue_sequence(x, cache), Contains("nn::CausalSelfAttention") && Contains("[2, 5, 3, 4]"));
    // with gradients on, the cached form is refused by the op, and the cache keeps its steps
    nn::AttentionCache<double> seen;
    attention.continue_sequence(x, seen);
    {
        olmax::autodiff::enable_grad on;
        const auto xp = olmax::parameter(x.clone());
        CHECK_THROWS_WITH(attention.continue_sequence(xp, seen), Contains("causal_attention") && Contains("no_grad"));
    }
    CHECK(seen.steps() == 3);
    nn::Config c = continuation_config(4);
    c.depth = 2;
    const nn::Stack<models::GatedDeltaNetMlp::block<double>> stack(c, rng);
    decltype(stack)::sequence_state three(3);
    CHECK_THROWS_WITH(stack.continue_sequence(nn::two_streams(x), three), Contains("nn::Stack") && Contains("3 layers for a stack of 2"));
}

TEST_CASE("nn::AttentionCache: steps written in place with room to grow, copies independent of the original", "[continuation]") {
    olmax::Generator rng(17);
    olmax::autodiff::no_grad off;
    const std::size_t B = 2, F = 8, T = 40;
    const nn::AttentionConfig a{.features = F, .heads = 4, .kv_heads = 2, .head_dim = 4, .query_tile = 3, .key_tile = 4};
    const nn::CausalSelfAttention<double> layer(a, rng);
    const auto x = olmax::randn<double>({B, T, F}, rng);
    const Tensor<double> whole = layer.forward(x);
    // one step at a time: the room grows geometrically, so the buffers are replaced O(log T) times
    nn::AttentionCache<double> cache;
    std::size_t growths = 0, room = 0;
    std::vector<Tensor<double>> outputs;
    for (std::size_t t = 0; t < T; ++t) {
        outputs.push_back(layer.continue_sequence(olmax::slice(x, 1, t, t + 1), cache));
        CHECK(cache.steps() == t + 1);
        CHECK(cache.capacity() >= cache.steps());
        CHECK(cache.capacity() <= 2 * cache.steps());
        growths += cache.capacity() != room;
        room = cache.capacity();
    }
    CHECK(growths <= 7);  // 1, 2, 4, 8, 16, 32, 64 for 40 steps
    CHECK(olmax_test::max_abs_diff(olmax::concat(outputs, 1), whole) < 1e-10);
    REQUIRE(cache.keys().shape() == olmax::Shape{B, T, 2, 4});
    REQUIRE(cache.values().shape() == olmax::Shape{B, T, 2, 4});
    // the keys and values are those of one call on the whole sequence
    nn::AttentionCache<double> at_once;
    layer.continue_sequence(x, at_once);
    CHECK(olmax_test::max_abs_diff(cache.keys(), at_once.keys()) < 1e-12);
    CHECK(olmax_test::max_abs_diff(cache.values(), at_once.values()) < 1e-12);
    // a copy continues on its own: two branches from the same prefix each equal a fresh run on theirs
    const std::size_t prefix = 20;
    nn::AttentionCache<double> trunk;
    layer.continue_sequence(olmax::slice(x, 1, 0, prefix), trunk);
    layer.continue_sequence(olmax::slice(x, 1, prefix, prefix + 1), trunk);  // room past the steps
    REQUIRE(trunk.capacity() > trunk.steps());
    nn::AttentionCache<double> branch = trunk;
    const auto other = olmax::randn<double>({B, 3, F}, rng);
    const auto from_branch = layer.continue_sequence(other, branch);
    const auto from_trunk = layer.continue_sequence(olmax::slice(x, 1, prefix + 1, prefix + 4), trunk);
    CHECK(olmax_test::max_abs_diff(from_trunk, olmax::slice(whole, 1, prefix + 1, prefix + 4)) < 1e-10);
    const auto branched = layer.forward(olmax::concat({olmax::slice(x, 1, 0, prefix + 1), other}, 1));
    CHECK(olmax_test::max_abs_diff(from_branch, olmax::slice(branched, 1, prefix + 1, prefix + 4)) < 1e-10);
    // a cache started from given keys and values continues from them
    nn::AttentionCache<double> given(at_once.keys(), at_once.values());
    CHECK(given.steps() == T);
    CHECK(layer.continue_sequence(other, given).shape() == olmax::Shape{B, 3, F});
    CHECK(given.steps() == T + 3);
}

TEST_CASE("nn::AttentionCache: under a sliding window only the last W - 1 steps are kept, so decoding holds O(W) keys", "[continuation]") {
    olmax::Generator rng(19);
    olmax::autodiff::no_grad off;
    const std::size_t B = 2, F = 8, T = 60, W = 5;
    const nn::AttentionConfig a{.features = F, .heads = 2, .kv_heads = 1, .head_dim = 4, .window = W, .query_tile = 3, .key_tile = 4};
    const nn::CausalSelfAttention<double> layer(a, rng);
    const auto x = olmax::randn<double>({B, T, F}, rng);
    const Tensor<double> whole = layer.forward(x);
    SECTION("one step at a time") {
        nn::AttentionCache<double> cache;
        std::vector<Tensor<double>> outputs;
        for (std::size_t t = 0; t < T; ++t) {
            outputs.push_back(layer.continue_sequence(olmax::slice(x, 1, t, t + 1), cache));
            CHECK(cache.steps() == t + 1);  // RoPE's positions go on from every step seen
            CHECK(cache.held() >= std::min(t + 1, W - 1));
            CHECK(cache.held() <= cache.capacity());
            CHECK(cache.capacity() <= 2 * (W - 1));  // 1, 2, 4, 8, then drops instead of growth
        }
        CHECK(olmax_test::max_abs_diff(olmax::concat(outputs, 1), whole) < 1e-10);
        // the held keys are the last ones of a call on the whole sequence
        nn::AttentionCache<double> at_once;
        layer.continue_sequence(x, at_once);
        REQUIRE(at_once.held() == T);
        const std::size_t held = cache.held();
        REQUIRE(cache.keys().shape() == olmax::Shape{B, held, 1, 4});
        CHECK(olmax_test::max_abs_diff(cache.keys(), olmax::slice(at_once.keys(), 1, T - held, T)) < 1e-12);
        CHECK(olmax_test::max_abs_diff(cache.values(), olmax::slice(at_once.values(), 1, T - held, T)) < 1e-12);
    }
    SECTION("a prompt, then pieces of several steps, some longer than the window") {
        nn::AttentionCache<double> cache;
        std::vector<Tensor<double>> outputs;
        std::size_t t = 0;
        for (const std::size_t n : {23, 1, 7, 2, 1, 1, 12, 3, 10}) {
            outputs.push_back(layer.continue_sequence(olmax::slice(x, 1, t, t + n), cache));
            t += n;
            CHECK(cache.steps() == t);
            if (t == 24) {  // the prompt's buffers of 23 steps, shrunk at the first drop: 4 kept + 1 new, twice
                CHECK(cache.held() == W);
                CHECK(cache.capacity() == 2 * W);
            }
            if (t > 23) CHECK(cache.capacity() <= 2 * (W - 1 + 12));
        }
        REQUIRE(t == T);
        CHECK(olmax_test::max_abs_diff(olmax::concat(outputs, 1), whole) < 1e-10);
    }
    SECTION("keys the cache did not allocate are never written: given ones, and the first call's") {
        nn::AttentionCache<double> first;
        layer.continue_sequence(olmax::slice(x, 1, 0, 20), first);
        const Tensor<double> k = first.keys(), v = first.values(), k_before = k.clone(), v_before = v.clone();
        nn::AttentionCache<double> given(k, v);
        for (std::size_t t = 20; t < 23; ++t) {
            const auto step = olmax::slice(x, 1, t, t + 1);
            CHECK(olmax_test::max_abs_diff(layer.continue_sequence(step, first), olmax::slice(whole, 1, t, t + 1)) < 1e-10);
            CHECK(olmax_test::max_abs_diff(layer.continue_sequence(step, given), olmax::slice(whole, 1, t, t + 1)) < 1e-10);
        }
        CHECK(olmax_test::max_abs_diff(k, k_before) == 0);
        CHECK(olmax_test::max_abs_diff(v, v_before) == 0);
    }
}

TEST_CASE("ByteLM::Decoder: logits of the model on its window, restarting from the last half of the context when full", "[continuation]") {
    const models::ByteLM<models::Hybrid, double> model(models::ByteLMConfig{.features = 8, .depth = 1, .seed = 3});
    const std::size_t window = 8;
    models::ByteLM<models::Hybrid, double>::Decoder decoder(model, window);
    const std::string text = "\x04The quick brown fox";
    std::vector<std::uint8_t> context;
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto byte = std::uint8_t(text[i]);
        context.push_back(byte);
        const std::vector<double> logits = decoder.append(byte);
        const auto& w = decoder.window();
        INFO("byte " << i);
        // the window: every byte so far while it fits, else the last ceil(8 / 2) = 4 to 8 bytes of the context
        REQUIRE(w.size() <= window);
        REQUIRE(std::equal(w.begin(), w.end(), context.end() - std::ptrdiff_t(w.size())));
        if (i < window) CHECK(w.size() == i + 1);
        else CHECK(w.size() == 4 + (i - window) % 5);  // 4, 5, 6, 7, 8, then 4 again
        Tensor<std::int32_t> ids({1, w.size()});
        std::copy(w.begin(), w.end(), ids.data());
        olmax::autodiff::no_grad off;
        const auto expected = olmax::slice(model.head.logits(model.hidden(ids)), 1, w.size() - 1, w.size());
        REQUIRE(logits.size() == expected.size());
        double worst = 0;
        for (std::size_t v = 0; v < logits.size(); ++v) worst = std::max(worst, std::abs(logits[v] - expected.data()[v]));
        CHECK(worst < 1e-10);
    }
    // several bytes at once, and a prompt longer than the window: its last half
    models::ByteLM<models::Hybrid, double>::Decoder long_prompt(model, window);
    const std::vector<std::uint8_t> prompt(context.begin(), context.end());
    long_prompt.append(prompt);
    CHECK(long_prompt.window() == std::vector<std::uint8_t>(prompt.end() - 4, prompt.end()));
    CHECK_THROWS_AS(long_prompt.append(std::span<const std::uint8_t>()), olmax::value_error);
    CHECK_THROWS_AS((models::ByteLM<models::Hybrid, double>::Decoder(model, 0)), olmax::value_error);
}

TEST_CASE("ByteLM::sample: a stepwise model draws the bytes asked for, the same for the same seed", "[continuation]") {
    const models::ByteLM<models::GatedDeltaNetMlp> model(models::ByteLMConfig{.features = 8, .depth = 2, .seed = 4});
    olmax::data::SamplingConfig sampling;
    sampling.temperature = 2.0;  // a nearly uniform draw: no end-of-document byte for a while
    olmax::Generator a(9), b(9);
    std::string first, second;
    const std::size_t drawn = model.sample("ab", 40, 16, sampling, a, [&](char byte) {
        first.push_back(byte);
        return true;
    });
    second = model.sample("ab", 40, 16, sampling, b);
    CHECK(drawn == first.size());
    CHECK(first == second);
    CHECK(first.size() > 0);
}

namespace {

/// Rows of a batch for ByteLM::masked_nll, every target real unless `last_only` (then only each
/// row's last).
olmax::data::Batch rows_of(const std::vector<std::vector<std::uint8_t>>& inputs, const std::vector<std::vector<std::uint8_t>>& targets,
                           bool last_only) {
    const std::size_t n = inputs.size(), s = inputs[0].size();
    olmax::data::Batch batch;
    batch.inputs = Tensor<std::int32_t>({n, s});
    batch.targets = Tensor<std::int32_t>({n, s});
    batch.mask = Tensor<float>({n, s}, last_only ? 0.0f : 1.0f);
    for (std::size_t r = 0; r < n; ++r) {
        std::copy(inputs[r].begin(), inputs[r].end(), batch.inputs.data() + r * s);
        std::copy(targets[r].begin(), targets[r].end(), batch.targets.data() + r * s);
        batch.mask.data()[r * s + s - 1] = 1.0f;
    }
    return batch;
}

}  // namespace

TEST_CASE("ByteLM::score: a document's loss as sample reads it, stepwise and by the window", "[continuation]") {
    using Model = models::ByteLM<models::Hybrid, double>;
    const Model model(models::ByteLMConfig{.features = 8, .depth = 1, .seed = 3});
    constexpr std::uint8_t end = olmax::data::ByteTokenizer::end_of_document;
    const std::string text = "Hello, world";
    const std::vector<std::uint8_t> document(text.begin(), text.end());
    std::vector<std::uint8_t> input{end}, target(document);  // [EOD doc] -> [doc EOD]
    input.insert(input.end(), document.begin(), document.end());
    target.push_back(end);
    const std::size_t n = input.size();  // 13 predictions

    // Within the window, stepwise is the loss of one forward over the row, as evaluation scores a
    // row that starts at a document's start.
    const auto [row_nats, row_count] = model.masked_nll(rows_of({input}, {target}, false));
    const models::TextScore stepwise = model.score(document, 16, models::Decoding::stepwise);
    CHECK(stepwise.predictions == n);
    CHECK(row_count == double(n));
    CHECK(std::abs(stepwise.nats - row_nats) < 1e-9);
    CHECK(std::abs(stepwise.bits_per_byte() - row_nats / double(n) / std::log(2.0)) < 1e-12);

    // The window: prediction i from the last `window` bytes before it, padded on the left with
    // end-of-document bytes, i.e. the last position of one padded row per prediction.
    const std::size_t window = 6;
    std::vector<std::vector<std::uint8_t>> padded_inputs, padded_targets;
    for (std::size_t i = 0; i < n; ++i) {
        std::vector<std::uint8_t> row(window, end), next(window, end);
        for (std::size_t k = 0; k < window && k <= i; ++k) row[window - 1 - k] = input[i - k];
        next[window - 1] = target[i];
        padded_inputs.push_back(row);
        padded_targets.push_back(next);
    }
    const auto [window_nats, window_count] = model.masked_nll(rows_of(padded_inputs, padded_targets, true));
    const models::TextScore windowed = model.score(document, window, models::Decoding::window);
    CHECK(windowed.predictions == n);
    CHECK(window_count == double(n));
    CHECK(std::abs(windowed.nats - window_nats) < 1e-9);

    // Longer than the window: the decoder restarts, one prediction per byte still; scores add.
    const models::TextScore restarted = model.score(document, 4, models::Decoding::stepwise);
    CHECK(restarted.predictions == n);
    CHECK(std::isfinite(restarted.nats));
    CHECK(restarted.nats != stepwise.nats);
    models::TextScore both = stepwise;
    both += restarted;
    CHECK(both.predictions == 2 * n);
    CHECK(both.nats == stepwise.nats + restarted.nats);

    // A model that cannot continue a sequence scores by the window whatever it is asked; an empty
    // document is one prediction (its end); no window is refused.
    const models::ByteLM<models::ConvMixer, double> conv(models::ByteLMConfig{.features = 16, .depth = 1, .seed = 3});
    CHECK(conv.score(document, 16, models::Decoding::stepwise).nats == conv.score(document, 16, models::Decoding::window).nats);
    CHECK(model.score({}, 16).predictions == 1);
    CHECK_THROWS_WITH(model.score(document, 0), Catch::Matchers::Contains("models::ByteLM::score") && Catch::Matchers::Contains("window"));
}
