// Optimisers: Adam/AdamW against PyTorch reference values (tests/data/optim_reference_*.txt, made
// by tools/make_optim_reference.py), clipping and the LR schedule against hand-derived values.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include <olmax/optim/optim.hpp>

#include "test_helpers.hpp"

namespace {
using olmax_test::test_data_dir;
using olmax_test::same_bits;

using olmax::Shape;
using olmax::Tensor;
namespace optim = olmax::optim;

struct Reference {
    std::map<std::string, std::string> config;
    struct Param {
        std::string name;
        olmax::nn::Role role;
        Shape shape;
        std::vector<double> values;
    };
    std::vector<Param> params;
    std::map<std::pair<int, std::string>, std::vector<double>> grads, expected;
    std::map<int, double> lr;
    int steps = 0;

    double number(const std::string& key) const { return std::stod(config.at(key)); }
};

std::vector<double> read_values(std::istringstream& in) {
    std::string colon;
    in >> colon;
    REQUIRE(colon == ":");
    std::vector<double> out;
    double v;
    while (in >> v) out.push_back(v);
    return out;
}

Reference load_reference(const std::string& name) {
    std::ifstream file(test_data_dir() / ("optim_reference_" + name + ".txt"));
    REQUIRE(file.good());
    Reference ref;
    std::string line;
    while (std::getline(file, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream in(line);
        std::string kind;
        in >> kind;
        if (kind == "config") {
            std::string kv;
            while (in >> kv) ref.config[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
        } else if (kind == "param") {
            Reference::Param p;
            std::string role, token;
            in >> p.name >> role;
            p.role = olmax::nn::parse_role(role);
            while (in >> token && token != ":") p.shape.push_back(std::stoul(token));
            double v;
            while (in >> v) p.values.push_back(v);
            ref.params.push_back(p);
        } else if (kind == "grad" || kind == "expect") {
            int step;
            std::string pname;
            in >> step >> pname;
            (kind == "grad" ? ref.grads : ref.expected)[{step, pname}] = read_values(in);
            ref.steps = std::max(ref.steps, step);
        } else if (kind == "lr") {
            int step;
            double lr;
            in >> step >> lr;
            ref.lr[step] = lr;
        }
    }
    REQUIRE(ref.steps > 0);
    return ref;
}

optim::AdamWConfig config_of(const Reference& ref) {
    optim::AdamWConfig c;
    c.schedule.peak_lr = ref.number("peak_lr");
    c.schedule.warmup_steps = std::int64_t(ref.number("warmup"));
    c.schedule.exponential_decay = ref.number("decay");
    c.beta1 = ref.number("beta1");
    c.beta2 = ref.number("beta2");
    c.eps = ref.number("eps");
    c.weight_decay = ref.number("weight_decay");
    c.decay_policy = optim::WeightDecayPolicy::matrices;
    c.decay_mode = ref.config.at("optimizer") == "Adam" ? optim::WeightDecayMode::l2 : optim::WeightDecayMode::decoupled;
    c.max_grad_norm = ref.number("clip_norm");
    return c;
}

template <class T>
void check_against_reference(const std::string& name, double rel_tol) {
    const Reference ref = load_reference(name);
    std::vector<optim::Parameter<T>> params;
    for (const auto& p : ref.params) {
        std::vector<T> values(p.values.begin(), p.values.end());
        params.push_back(optim::make_parameter(p.name, p.role, olmax::parameter(Tensor<T>::from(p.shape, std::span<const T>(values)))));
    }
    optim::AdamW<T> opt(params, config_of(ref));
    for (int step = 1; step <= ref.steps; ++step) {
        INFO(name << " step " << step);
        CHECK(opt.next_lr() == Approx(ref.lr.at(step)).epsilon(1e-12));
        opt.zero_grad();
        for (auto& p : params) {
            const auto& g = ref.grads.at({step, p.name});
            // Put the reference gradient in place through the tape: backward of sum(p * g).
            auto seed = Tensor<T>::uninitialized(p.tensor.shape());
            std::transform(g.begin(), g.end(), seed.begin(), [](double v) { return T(v); });
            p.tensor.backward(seed);
        }
        opt.step();
        for (const auto& p : params) {
            const auto& want = ref.expected.at({step, p.name});
            for (std::size_t i = 0; i < want.size(); ++i) {
                INFO(p.name << "[" << i << "]");
                CHECK(double(p.tensor.data()[i]) == Approx(want[i]).epsilon(rel_tol).margin(rel_tol * 1e-3));
            }
        }
    }
}

}  // namespace

TEST_CASE("optim: AdamW matches torch.optim.AdamW (float64)", "[optim]") { check_against_reference<double>("adamw", 1e-6); }
TEST_CASE("optim: Adam with L2 decay matches torch.optim.Adam (float64)", "[optim]") { check_against_reference<double>("adam_l2", 1e-6); }
TEST_CASE("optim: AdamW + global-norm clipping matches torch clip_grad_norm_ + AdamW", "[optim]") {
    check_against_reference<double>("adamw_clip", 1e-6);
}
TEST_CASE("optim: AdamW on float32 parameters follows the float64 reference", "[optim]") { check_against_reference<float>("adamw", 2e-5); }

TEST_CASE("optim: first AdamW step is bias-corrected (hand-derived)", "[optim]") {
    // After step 1, m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps) = lr * sign(g).
    auto w = olmax::parameter(Tensor<double>::from({3}, {1.0, -2.0, 0.5}));
    optim::AdamWConfig c;
    c.schedule.peak_lr = 0.1;
    c.eps = 0;
    optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    w.backward(Tensor<double>::from({3}, {1e-4, -3.0, 7.0}));
    opt.step();
    CHECK(w(0) == Approx(0.9));
    CHECK(w(1) == Approx(-1.9));
    CHECK(w(2) == Approx(0.4));
}

TEST_CASE("optim: weight decay follows roles, not names", "[optim]") {
    // Zero gradients isolate the decoupled decay: p <- p * (1 - lr * wd).
    auto named_norm = olmax::parameter(Tensor<double>({2, 2}, 1.0));  // a matrix whose name contains "norm"
    auto scale = olmax::parameter(Tensor<double>({2}, 1.0));
    auto bias = olmax::parameter(Tensor<double>({2}, 1.0));
    auto emb = olmax::parameter(Tensor<double>({3, 2}, 1.0));
    optim::AdamWConfig c;
    c.schedule.peak_lr = 0.5;
    c.weight_decay = 0.2;
    optim::AdamW<double> opt({optim::make_parameter("block/prenorm/w", olmax::nn::Role::weight, named_norm),
                              optim::make_parameter("weight_like_scale", olmax::nn::Role::norm_scale, scale),
                              optim::make_parameter("b", olmax::nn::Role::bias, bias),
                              optim::make_parameter("emb", olmax::nn::Role::embedding, emb)},
                             c);
    for (auto t : {named_norm, scale, bias, emb}) t.backward(zeros_like(t));
    opt.step();
    CHECK(named_norm(0, 0) == Approx(0.9));
    CHECK(emb(2, 1) == Approx(0.9));
    CHECK(scale(0) == 1.0);
    CHECK(bias(1) == 1.0);
    CHECK(optim::receives_weight_decay(olmax::nn::Role::embedding, optim::WeightDecayPolicy::embeddings_only));
    CHECK_FALSE(optim::receives_weight_decay(olmax::nn::Role::weight, optim::WeightDecayPolicy::embeddings_only));
    CHECK(optim::receives_weight_decay(olmax::nn::Role::norm_scale, optim::WeightDecayPolicy::all));
    CHECK_FALSE(optim::receives_weight_decay(olmax::nn::Role::embedding, optim::WeightDecayPolicy::none));
    // The layers' roles are the optimiser's: the default policy decays matrices and embeddings only.
    using olmax::nn::Role;
    for (Role role : {Role::weight, Role::bias, Role::norm_scale, Role::embedding, Role::scalar, Role::other}) {
        INFO(olmax::nn::role_name(role));
        CHECK(olmax::nn::parse_role(olmax::nn::role_name(role)) == role);
        CHECK(optim::receives_weight_decay(role, optim::WeightDecayPolicy::matrices) == (role == Role::weight || role == Role::embedding));
    }
}

TEST_CASE("optim: LR schedule warmup then exponential decay from the end of warmup", "[optim]") {
    optim::LrSchedule s{.peak_lr = 0.01, .warmup_steps = 4, .exponential_decay = 0.5};
    CHECK(s(1) == Approx(0.0025));
    CHECK(s(2) == Approx(0.005));
    CHECK(s(4) == Approx(0.01));
    CHECK(s(5) == Approx(0.005));
    CHECK(s(7) == Approx(0.00125));
    s.decay_start = 0;  // the original's behaviour: decay already during warmup
    CHECK(s(2) == Approx(0.005 * 0.25));
    optim::LrSchedule floor{.peak_lr = 1.0, .warmup_steps = 0, .exponential_decay = 0.5, .decay_start = -1, .min_lr = 0.1};
    CHECK(floor(1) == Approx(0.5));
    CHECK(floor(10) == Approx(0.1));
    CHECK_THROWS_AS(s(0), olmax::value_error);
    CHECK_THROWS_AS((optim::LrSchedule{.exponential_decay = 1.5}.validate()), olmax::value_error);
}

TEST_CASE("optim: cosine and linear schedules decay from the peak to min_lr over total_steps or the reported progress", "[optim]") {
    optim::LrSchedule s{.peak_lr = 1.0, .warmup_steps = 2, .min_lr = 0.1, .decay = optim::LrDecay::cosine, .total_steps = 12};
    CHECK(s(1) == Approx(0.5));   // warmup as before
    CHECK(s(2) == Approx(1.0));   // progress 0
    CHECK(s(7) == Approx(0.55));  // half of the 10 decayed steps: the mean of peak and floor
    CHECK(s(12) == Approx(0.1));
    CHECK(s(40) == Approx(0.1));  // past the end: the floor
    CHECK(s(3, 0.5) == Approx(0.55));  // a larger reported progress wins ...
    CHECK(s(7, 0.1) == Approx(0.55));  // ... a smaller one does not
    auto linear = s;
    linear.decay = optim::LrDecay::linear;
    CHECK(linear(7) == Approx(0.55));
    CHECK(linear(4) == Approx(1.0 - 0.9 * 0.2));
    linear.total_steps = 0;  // only the reported progress decays
    CHECK(linear(1000) == Approx(1.0));
    CHECK(linear(1000, 0.75) == Approx(1.0 - 0.9 * 0.75));
    CHECK(linear(1000, 3.0) == Approx(0.1));
    CHECK(optim::parse_lr_decay("cosine") == optim::LrDecay::cosine);
    CHECK_THROWS_WITH(optim::parse_lr_decay("cosin"), Catch::Contains("unknown decay 'cosin'"));
    CHECK_THROWS_AS((optim::LrSchedule{.total_steps = -1}.validate()), olmax::value_error);
}

TEST_CASE("optim: unit-wise AGC clips each output unit against its own weight norm", "[optim]") {
    // W[in=2, out=2]; units are columns (the output axis is last). Column 0: ||W||=5, ||G||=1 ->
    // limit 0.1*5 = 0.5, factor 0.5. Column 1: ||W||=1, ||G||=0.05 < 0.1: untouched.
    auto w = Tensor<double>::from({2, 2}, {3.0, 1.0, 4.0, 0.0});
    auto g = Tensor<double>::from({2, 2}, {0.6, 0.03, 0.8, 0.04});
    optim::AgcConfig agc{.clip = 0.1};
    CHECK(optim::adaptive_grad_clip(w, g, agc) == 1);
    CHECK(g(0, 0) == Approx(0.3));
    CHECK(g(1, 0) == Approx(0.4));
    CHECK(g(0, 1) == 0.03);
    CHECK(g(1, 1) == 0.04);

    SECTION("rows as units when the output axis is 0") {
        auto g2 = Tensor<double>::from({2, 2}, {0.6, 0.03, 0.8, 0.04});
        // Row 0: ||W||=sqrt(10), ||G||=sqrt(0.3609); row 1: ||W||=4, ||G||=sqrt(0.6416).
        optim::adaptive_grad_clip(w, g2, agc, 0, 0);
        const double f0 = 0.1 * std::sqrt(10.0) / std::sqrt(0.3609), f1 = 0.1 * 4.0 / std::sqrt(0.6416);
        CHECK(g2(0, 1) == Approx(0.03 * f0));
        CHECK(g2(1, 0) == Approx(0.8 * f1));
    }
    SECTION("vectors clip element-wise and zero weights use the floor") {
        auto b = Tensor<double>::from({2}, {0.0, 2.0});
        auto gb = Tensor<double>::from({2}, {1.0, -0.1});
        optim::adaptive_grad_clip(b, gb, agc);
        CHECK(gb(0) == Approx(0.1 * 1e-3));
        CHECK(gb(1) == Approx(-0.1));
    }
    SECTION("stacked layers never share a norm") {
        auto ws = Tensor<double>::from({2, 1, 1}, {1.0, 100.0});
        auto gs = Tensor<double>::from({2, 1, 1}, {1.0, 1.0});
        optim::adaptive_grad_clip(ws, gs, agc, 1);
        CHECK(gs(0, 0, 0) == Approx(0.1));
        CHECK(gs(1, 0, 0) == 1.0);
    }
    SECTION("stacked matrices with the unit axis last follow the per-unit definition") {
        // W[stack=2, in=3, out=5]: unit (s, o) has fan-in W[s, :, o].
        const std::size_t S = 2, I = 3, O = 5;
        std::vector<double> wv(S * I * O), gv(S * I * O);
        for (std::size_t i = 0; i < wv.size(); ++i) {
            wv[i] = std::sin(1.3 * double(i)) * (i % 4 == 0 ? 0.01 : 1.0);
            gv[i] = std::cos(0.9 * double(i));
        }
        auto wt = Tensor<double>::from({S, I, O}, wv);
        auto gt = Tensor<double>::from({S, I, O}, gv);
        const optim::AgcConfig strict{.clip = 1.0};
        std::size_t want_clipped = 0;
        std::vector<double> want = gv;
        for (std::size_t st = 0; st < S; ++st)
            for (std::size_t o = 0; o < O; ++o) {
                double ws = 0, gs = 0;
                for (std::size_t i = 0; i < I; ++i) {
                    ws += wv[(st * I + i) * O + o] * wv[(st * I + i) * O + o];
                    gs += gv[(st * I + i) * O + o] * gv[(st * I + i) * O + o];
                }
                const double limit = strict.clip * std::max(std::sqrt(ws), strict.param_floor);
                if (std::sqrt(gs) <= limit) continue;
                ++want_clipped;
                for (std::size_t i = 0; i < I; ++i) want[(st * I + i) * O + o] *= limit / std::sqrt(gs);
            }
        REQUIRE(want_clipped > 0);
        REQUIRE(want_clipped < S * O);  // both kinds of unit
        CHECK(optim::adaptive_grad_clip(wt, gt, strict, 1) == want_clipped);
        for (std::size_t i = 0; i < want.size(); ++i) CHECK(gt.data()[i] == Approx(want[i]).epsilon(1e-12));
    }
    auto bad = Tensor<double>({3, 2});
    CHECK_THROWS_AS(optim::adaptive_grad_clip(w, bad, agc), olmax::shape_error);
}

TEST_CASE("optim: AGC as tensor ops (a traced step's) equals the in-place clip on every layout", "[optim]") {
    olmax::Generator rng(41);
    struct Layout {
        Shape shape;
        std::size_t stacked;
        long unit_axis;
    };
    const Layout layouts[] = {{{4, 6}, 0, -1}, {{4, 6}, 0, 0}, {{7}, 0, -1}, {{3, 4, 5}, 1, -1}, {{3, 4, 5}, 1, 1}, {{2, 3, 4, 5}, 1, 2},
                              {{3, 5}, 1, -1}, {{2, 3}, 2, -1}};
    for (const auto& l : layouts) {
        INFO("shape " << olmax::to_string(l.shape) << ", stacked " << l.stacked << ", unit axis " << l.unit_axis);
        auto w = olmax::randn<double>(l.shape, rng);
        for (std::size_t i = 0; i < w.size(); i += 5) w.data()[i] *= 1e-4;  // some units under the parameter floor
        const auto g = olmax::randn<double>(l.shape, rng);
        for (const double clip : {0.05, 0.5, 5.0}) {
            const optim::AgcConfig agc{.clip = clip};
            auto in_place = g.clone();
            const std::size_t clipped = optim::adaptive_grad_clip(w, in_place, agc, l.stacked, l.unit_axis);
            const auto by_ops = optim::adaptive_grad_clip_ops(w, g, agc, l.stacked, l.unit_axis);
            if (clip == 0.05) CHECK(clipped > 0);
            CHECK(olmax_test::max_abs_diff(by_ops, in_place) < 1e-12);
        }
    }
    // a limit that can fall below grad_floor is refused (there the min form would scale a unit the
    // in-place clip leaves alone)
    const auto w = olmax::randn<double>({2, 2}, rng);
    CHECK_THROWS_WITH(optim::adaptive_grad_clip_ops(w, w, {.clip = 1e-14}), Catch::Contains("clip * param_floor"));
    CHECK_THROWS_AS(optim::adaptive_grad_clip_ops(w, Tensor<double>({3}), {.clip = 0.1}), olmax::shape_error);
}

TEST_CASE("optim: global-norm clipping scales all gradients together", "[optim]") {
    auto a = olmax::parameter(Tensor<double>({2}));
    auto b = olmax::parameter(Tensor<double>({1}));
    a.backward(Tensor<double>::from({2}, {3.0, 0.0}));
    b.backward(Tensor<double>::from({1}, {4.0}));
    std::vector<optim::Parameter<double>> ps{optim::make_parameter("a", olmax::nn::Role::weight, a),
                                             optim::make_parameter("b", olmax::nn::Role::bias, b)};
    CHECK(optim::clip_grad_norm(std::span<const optim::Parameter<double>>(ps), 1.0) == Approx(5.0));
    CHECK(a.grad()(0) == Approx(3.0 / (5.0 + 1e-6)));
    CHECK(b.grad()(0) == Approx(4.0 / (5.0 + 1e-6)));
    CHECK(optim::global_grad_norm(std::span<const optim::Parameter<double>>(ps)) == Approx(1.0));
}

TEST_CASE("optim: non-finite gradients are refused without touching anything", "[optim]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1.0, 2.0}));
    optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, optim::AdamWConfig{});
    w.backward(Tensor<double>::from({2}, {1.0, std::nan("")}));
    CHECK_THROWS_AS(opt.step(), optim::non_finite_gradient);
    CHECK(opt.step_count() == 0);
    CHECK(w(0) == 1.0);
    CHECK(w(1) == 2.0);
}

TEST_CASE("optim: gradients overflowing the norm are finite, NaN/Inf are refused on every path", "[optim]") {
    auto w = olmax::parameter(Tensor<double>::from({3}, {1.0, 2.0, 3.0}));
    optim::AdamWConfig c;
    c.max_grad_norm = 1.0;
    optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    // (5e154)^2 overflows the sum of squares, yet every gradient is finite: the step runs (with an
    // infinite norm, so global clipping stays off) and moves w by lr against the gradient's sign
    // (v = 1e-3 g^2 still fits a double).
    w.backward(Tensor<double>::from({3}, {5e154, -5e154, 0.0}));
    const auto report = opt.step();
    CHECK(std::isinf(report.grad_norm));
    CHECK(opt.step_count() == 1);
    CHECK(w(0) == Approx(1.0 - 1e-3));
    CHECK(w(1) == Approx(2.0 + 1e-3));
    CHECK(w(2) == 3.0);
    for (double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL})
        for (double agc : {0.0, 0.01}) {
            INFO("gradient " << bad << ", agc " << agc);
            auto a = olmax::parameter(Tensor<float>::from({20}, std::vector<float>(20, 0.5f)));
            auto b = olmax::parameter(Tensor<float>::from({2}, {1.0f, 2.0f}));
            optim::AdamWConfig cf;
            cf.max_grad_norm = 1.0;
            cf.agc.clip = agc;
            optim::AdamW<float> o({optim::make_parameter("a", olmax::nn::Role::weight, a), optim::make_parameter("b", olmax::nn::Role::bias, b)},
                                  cf);
            std::vector<float> ga(20, 3.0f);
            a.backward(Tensor<float>::from({20}, ga));
            b.backward(Tensor<float>::from({2}, {0.5f, float(bad)}));
            CHECK_THROWS_WITH(o.step(), Catch::Contains("parameter 'b'"));
            CHECK(o.step_count() == 0);
            CHECK(a.grad()(0) == 3.0f);  // not clipped either
            CHECK(a(0) == 0.5f);
            CHECK(b(0) == 1.0f);
        }
}

TEST_CASE("optim: AdamW results do not depend on the thread count or on tensor sizes", "[optim]") {
    // Sizes around the SIMD width (tails), uneven thread pieces that start mid-tensor, clipping
    // active, decoupled and L2 decay, every moment type: every element must come out bit-identical,
    // and equal to the scalar formula of torch.optim.AdamW to rounding.
    for (auto moments : {optim::MomentPrecision::float64, optim::MomentPrecision::float32, optim::MomentPrecision::bfloat16})
    for (auto mode : {optim::WeightDecayMode::decoupled, optim::WeightDecayMode::l2}) {
        auto run = [&](bool threaded, std::vector<std::vector<float>>& grads_after, std::vector<double>& norms) {
            std::mt19937 rng(7);
            std::normal_distribution<float> normal(0.0f, 1.0f);
            std::vector<optim::Parameter<float>> params;
            for (std::size_t n : {1, 3, 7, 8, 9, 17, 33, 250, 70001}) {  // 70001: three blocks of the norm's sum
                std::vector<float> values(n);
                for (auto& v : values) v = normal(rng);
                params.push_back(optim::make_parameter("p" + std::to_string(n), n % 2 ? olmax::nn::Role::weight : olmax::nn::Role::bias,
                                                       olmax::parameter(Tensor<float>::from({n}, values))));
            }
            optim::AdamWConfig c;
            c.schedule.peak_lr = 0.05;
            c.weight_decay = 0.1;
            c.max_grad_norm = 2.0;
            c.decay_mode = mode;
            c.moments = moments;
            optim::AdamW<float> opt(params, c);
            std::optional<olmax_test::ForceThreading> force;
            if (threaded) force.emplace();
            for (int step = 0; step < 4; ++step) {
                opt.zero_grad();
                for (auto& p : params) {
                    std::vector<float> g(p.tensor.size());
                    for (auto& v : g) v = normal(rng);
                    p.tensor.backward(Tensor<float>::from(p.tensor.shape(), g));
                }
                norms.push_back(opt.step().grad_norm);
            }
            grads_after.clear();
            for (auto& p : params) grads_after.emplace_back(p.tensor.grad().begin(), p.tensor.grad().end());
            std::vector<float> out;
            for (auto& p : params) out.insert(out.end(), p.tensor.begin(), p.tensor.end());
            return out;
        };
        std::vector<std::vector<float>> grads_serial, grads_threaded;
        std::vector<double> norms_serial, norms_threaded;
        const auto serial = run(false, grads_serial, norms_serial);
        const auto threaded = run(true, grads_threaded, norms_threaded);
        CHECK(norms_serial == norms_threaded);
        REQUIRE(serial.size() == threaded.size());
        CHECK(serial == threaded);
        CHECK(grads_serial == grads_threaded);
    }
}

TEST_CASE("optim: every element follows the scalar AdamW formula, tails included", "[optim]") {
    const std::size_t n = 37;
    std::vector<double> w0(n), g1(n), g2(n);
    for (std::size_t i = 0; i < n; ++i) {
        w0[i] = std::sin(0.3 * double(i)) + 0.1;
        g1[i] = std::cos(0.7 * double(i)) * 2.0;
        g2[i] = std::sin(1.1 * double(i) + 0.5) * 3.0;
    }
    auto w = olmax::parameter(Tensor<double>::from({n}, w0));
    optim::AdamWConfig c;
    c.schedule.peak_lr = 0.01;
    c.weight_decay = 0.05;
    c.max_grad_norm = 5.0;
    optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    std::vector<double> want = w0, m(n, 0.0), v(n, 0.0);
    int t = 0;
    for (const auto* g : {&g1, &g2}) {
        ++t;
        opt.zero_grad();
        w.backward(Tensor<double>::from({n}, *g));
        const double lr = c.schedule(t);
        double sum_sq = 0;
        for (double x : *g) sum_sq += x * x;
        const double scale = std::min(1.0, c.max_grad_norm / (std::sqrt(sum_sq) + 1e-6));
        CHECK(scale < 1.0);  // clipping is active on both steps
        const auto report = opt.step();
        CHECK(report.grad_norm == Approx(std::sqrt(sum_sq)).epsilon(1e-14));
        for (std::size_t i = 0; i < n; ++i) {
            const double grad = (*g)[i] * scale;
            want[i] *= 1.0 - lr * c.weight_decay;
            m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * grad;
            v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * grad * grad;
            const double denom = std::sqrt(v[i]) / std::sqrt(1.0 - std::pow(c.beta2, t)) + c.eps;
            want[i] -= lr / (1.0 - std::pow(c.beta1, t)) * m[i] / denom;
        }
        for (std::size_t i = 0; i < n; ++i) {
            INFO("step " << t << " element " << i);
            CHECK(w.data()[i] == Approx(want[i]).epsilon(1e-13).margin(1e-15));
        }
        // Global-norm clipping is applied as the gradients are read; the stored ones stay as given.
        CHECK(w.grad()(0) == (*g)[0]);
    }
}

TEST_CASE("optim: state export/import continues identically", "[optim]") {
    auto make = [](Tensor<double>& w) {
        w = olmax::parameter(Tensor<double>::from({3}, {1.0, -1.0, 0.5}));
        optim::AdamWConfig c;
        c.schedule = {.peak_lr = 0.1, .warmup_steps = 2, .exponential_decay = 0.1};
        c.weight_decay = 0.1;
        return optim::AdamW<double>({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    };
    auto run_steps = [](optim::AdamW<double>& opt, Tensor<double>& w, int from, int to) {
        for (int s = from; s < to; ++s) {
            opt.zero_grad();
            w.backward(Tensor<double>::from({3}, {std::sin(s + 1.0), std::cos(2.0 * s), 0.3 * s}));
            opt.step();
        }
    };
    Tensor<double> w1, w2;
    auto straight = make(w1);
    run_steps(straight, w1, 0, 6);
    auto first = make(w2);
    run_steps(first, w2, 0, 3);
    const auto state = first.export_state();
    const auto saved = w2.clone();
    Tensor<double> w3;
    auto resumed = make(w3);
    std::copy(saved.begin(), saved.end(), w3.begin());
    resumed.import_state(state);
    CHECK(resumed.step_count() == 3);
    run_steps(resumed, w3, 3, 6);
    for (std::size_t i = 0; i < 3; ++i) CHECK(w3.data()[i] == w1.data()[i]);  // bit-identical

    optim::AdamState wrong = state;
    wrong.slots[0].first_moment = Tensor<double>({4});
    CHECK_THROWS_AS(resumed.import_state(wrong), olmax::shape_error);
    wrong = state;
    wrong.slots[0].name = "v";
    CHECK_THROWS_AS(resumed.import_state(wrong), olmax::value_error);
}

TEST_CASE("optim: float32 moments follow float64 moments and move between checkpoints of either type", "[optim]") {
    // The same float parameters and gradients through 30 steps (warmup, decay, clipping active on
    // some steps) with each moment type: the float32 update differs by the rounding of the moments
    // and of the arithmetic (float instead of double): 4.8e-7 of the parameters' scale here (bound
    // 2e-6). Then a float32 optimiser's state goes into a float64 one and back: each continues
    // as the original (to the same bound; the float64 -> float32 way rounds the moments once).
    const std::size_t n = 1000;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> w0(n);
    for (auto& v : w0) v = normal(rng);
    std::vector<std::vector<float>> grads(30, std::vector<float>(n));
    for (std::size_t s = 0; s < grads.size(); ++s)
        for (auto& v : grads[s]) v = normal(rng) * float(1 + s % 3);
    auto make = [&](optim::MomentPrecision moments, Tensor<float>& w) {
        w = olmax::parameter(Tensor<float>::from({n}, w0));
        optim::AdamWConfig c;
        c.schedule = {.peak_lr = 0.01, .warmup_steps = 5, .exponential_decay = 0.01};
        c.weight_decay = 0.1;
        c.max_grad_norm = 40.0;  // between the gradients' norms (~32, ~63, ~95): some steps are clipped
        c.moments = moments;
        return optim::AdamW<float>({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    };
    auto run_steps = [&](optim::AdamW<float>& opt, Tensor<float>& w, std::size_t from, std::size_t to) {
        for (std::size_t s = from; s < to; ++s) {
            opt.zero_grad();
            w.backward(Tensor<float>::from({n}, grads[s]));
            opt.step();
        }
    };
    auto worst = [&](const Tensor<float>& a, const Tensor<float>& b) {
        double scale = 0, err = 0;
        for (std::size_t i = 0; i < n; ++i) {
            scale = std::max(scale, std::abs(double(a.data()[i])));
            err = std::max(err, std::abs(double(a.data()[i]) - double(b.data()[i])));
        }
        return err / scale;
    };
    Tensor<float> w64, w32;
    auto wide = make(optim::MomentPrecision::float64, w64);
    auto narrow = make(optim::MomentPrecision::float32, w32);
    run_steps(wide, w64, 0, 30);
    run_steps(narrow, w32, 0, 30);
    const double moved = worst(w64, Tensor<float>::from({n}, w0));
    CHECK(moved > 0.01);  // the steps did move the parameters
    CHECK(worst(w64, w32) <= 2e-6);
    CHECK(worst(w64, w32) > 0);  // the two types are really different computations

    // Double parameters with float moments: the update computed in float, against the double
    // formula (one step: m = 0.1 g, v = 0.001 g^2, so the step is lr * sign(g) to rounding).
    {
        auto w = olmax::parameter(Tensor<double>::from({19}, std::vector<double>(19, 0.5)));
        optim::AdamWConfig c;
        c.schedule.peak_lr = 0.01;
        c.moments = optim::MomentPrecision::float32;
        optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
        std::vector<double> g(19);
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = (i % 2 ? 1.0 : -1.0) * (0.1 + double(i));
        w.backward(Tensor<double>::from({19}, g));
        opt.step();
        for (std::size_t i = 0; i < g.size(); ++i) CHECK(w.data()[i] == Approx(0.5 - 0.01 * (g[i] > 0 ? 1 : -1)).epsilon(1e-6));
        CHECK(std::holds_alternative<Tensor<float>>(*opt.state_dict().find("w/second_moment")));
    }

    // Across types through state_dict, the form checkpoints store.
    for (const auto& [from, to] : {std::pair{optim::MomentPrecision::float32, optim::MomentPrecision::float64},
                                  std::pair{optim::MomentPrecision::float64, optim::MomentPrecision::float32}}) {
        Tensor<float> w_straight, w_first, w_resumed;
        auto straight = make(from, w_straight);
        run_steps(straight, w_straight, 0, 30);
        auto first = make(from, w_first);
        run_steps(first, w_first, 0, 15);
        const olmax::StateDict saved = first.state_dict();
        const bool saved_narrow = std::holds_alternative<Tensor<float>>(*saved.find("w/first_moment"));
        CHECK(saved_narrow == (from == optim::MomentPrecision::float32));  // stored in the optimiser's own type
        auto resumed = make(to, w_resumed);
        std::copy(w_first.begin(), w_first.end(), w_resumed.begin());
        resumed.load_state_dict(saved);
        CHECK(resumed.step_count() == 15);
        run_steps(resumed, w_resumed, 15, 30);
        CHECK(worst(w_straight, w_resumed) <= 2e-6);
    }

    // bfloat16 moments (stochastically rounded) against float64 ones: 2.5e-4 of the parameters'
    // scale after the 30 steps (bound 1e-3; float32's is 4.8e-7). Through state_dict they are saved as
    // float32 (exact) and load into either of the other types and back; a bfloat16 run resumed
    // from its own checkpoint repeats the straight run bit for bit (the rounding's random bits
    // depend on the step, not on the process).
    Tensor<float> w16;
    auto bf16_moments = make(optim::MomentPrecision::bfloat16, w16);
    run_steps(bf16_moments, w16, 0, 30);
    INFO("bfloat16 moments against float64 moments: " << worst(w64, w16) << " of the parameters' scale");
    CHECK(worst(w64, w16) <= 1e-3);
    CHECK(worst(w64, w16) > worst(w64, w32));  // bfloat16 really is the coarser type
    {
        Tensor<float> w_first, w_resumed;
        auto first = make(optim::MomentPrecision::bfloat16, w_first);
        run_steps(first, w_first, 0, 15);
        const olmax::StateDict saved = first.state_dict();
        CHECK(std::holds_alternative<Tensor<float>>(*saved.find("w/second_moment")));
        auto resumed = make(optim::MomentPrecision::bfloat16, w_resumed);
        std::copy(w_first.begin(), w_first.end(), w_resumed.begin());
        resumed.load_state_dict(saved);
        run_steps(resumed, w_resumed, 15, 30);
        CHECK(std::equal(w16.begin(), w16.end(), w_resumed.begin()));
        for (auto other : {optim::MomentPrecision::float32, optim::MomentPrecision::float64}) {
            Tensor<float> w_other;
            auto into = make(other, w_other);
            std::copy(w_first.begin(), w_first.end(), w_other.begin());
            into.load_state_dict(saved);  // bfloat16 -> wider: exact
            run_steps(into, w_other, 15, 30);
            CHECK(worst(w64, w_other) <= 1e-3);
            Tensor<float> w_back;
            auto back = make(optim::MomentPrecision::bfloat16, w_back);
            std::copy(w_other.begin(), w_other.end(), w_back.begin());
            back.load_state_dict(into.state_dict());  // wider -> bfloat16: rounded to nearest once
            CHECK(back.step_count() == 30);
        }
    }
}

TEST_CASE("optim: bfloat16 moments follow g and g^2 on average where rounding to nearest would stall", "[optim]") {
    // A constant gradient for 3000 steps: the debiased moments must equal g and g^2. With
    // beta2 = 0.999 each step moves v by about 0.1% of itself, less than half a bfloat16 ulp, so
    // rounding to nearest freezes v near 0.23-0.25 g^2 within the first 500 steps: debiased,
    // 0.24-0.26 g^2 at step 3000, an update twice too large (and m stalls 1.6-2.5% short of g;
    // simulated with olmax::bfloat16's rounding at g = 0.37, 1 and 2.9). Stochastic rounding keeps
    // both right in expectation. Each element's v carries rounding noise, so the check is on the
    // mean over 4096 elements of different magnitudes: within 1% (measured: m / g 1.00008,
    // v / g^2 0.99991).
    const std::size_t n = 4096;
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = float((i % 2 ? 1.0 : -1.0) * (0.01 + 0.37 * double(i % 11)) * std::pow(2.0, double(i % 5) - 2.0));
    auto w = olmax::parameter(Tensor<float>({n}, 0.0f));
    optim::AdamWConfig c;
    c.schedule.peak_lr = 1e-6;
    c.moments = optim::MomentPrecision::bfloat16;
    optim::AdamW<float> opt({optim::make_parameter("w", olmax::nn::Role::weight, w)}, c);
    const int steps = 3000;
    for (int s = 0; s < steps; ++s) {
        opt.zero_grad();
        w.backward(Tensor<float>::from({n}, g));
        opt.step();
    }
    const optim::AdamState state = opt.export_state();
    const double debias1 = 1.0 - std::pow(c.beta1, steps), debias2 = 1.0 - std::pow(c.beta2, steps);
    double first = 0, second = 0;
    for (std::size_t i = 0; i < n; ++i) {
        first += state.slots[0].first_moment.data()[i] / debias1 / double(g[i]);
        second += state.slots[0].second_moment.data()[i] / debias2 / (double(g[i]) * double(g[i]));
    }
    first /= double(n), second /= double(n);
    INFO("mean debiased m / g = " << first << ", v / g^2 = " << second);
    CHECK(first == Approx(1.0).epsilon(0.01));
    CHECK(second == Approx(1.0).epsilon(0.01));
}

TEST_CASE("optim: constructor rejects duplicate names and non-trainable tensors", "[optim]") {
    auto w = olmax::parameter(Tensor<double>({2}));
    CHECK_THROWS_AS(optim::AdamW<double>({optim::make_parameter("w", olmax::nn::Role::weight, w),
                                          optim::make_parameter("w", olmax::nn::Role::weight, olmax::parameter(Tensor<double>({2})))},
                                         {}),
                    olmax::value_error);
    CHECK_THROWS_AS(optim::AdamW<double>({optim::make_parameter("c", olmax::nn::Role::weight, Tensor<double>({2}))}, {}),
                    olmax::value_error);
    CHECK_THROWS_AS(optim::AdamW<double>({optim::make_parameter("a", olmax::nn::Role::weight, w),
                                          optim::make_parameter("b", olmax::nn::Role::weight, w)},
                                         {}),
                    olmax::value_error);
    CHECK_THROWS_AS(olmax::nn::parse_role("norm"), olmax::value_error);
}

TEST_CASE("optim::parameters_of reads names, roles, stacked axes and embedding units off the layer walk", "[optim]") {
    CHECK(optim::stacked_axes_of("linear/weight") == 0);
    CHECK(optim::stacked_axes_of("stack/*/dense/conv0/weight") == 1);
    CHECK(optim::stacked_axes_of("outer/*/inner/*/w") == 2);
    CHECK(optim::stacked_axes_of("*") == 1);
    CHECK(optim::stacked_axes_of("a*/b") == 0);

    olmax::models::ByteLMConfig config;
    config.features = 8;
    config.depth = 3;
    olmax::models::ByteLM<> model(config);
    auto params = optim::parameters_of(model);
    // The walk and the optimiser's view agree one to one, in order, sharing the tensors.
    const auto named = olmax::nn::parameters(model.stack);
    std::size_t stacked = 0;
    bool saw_embedding = false, saw_head = false;
    for (const auto& p : params) {
        INFO(p.name);
        if (p.name.rfind("stack/", 0) == 0) {
            REQUIRE(p.stacked_axes == 1);
            CHECK(p.tensor.shape()[0] == 3);  // the leading axis indexes the 3 layers
            CHECK(p.unit_axis == -1);
            ++stacked;
        } else {
            CHECK(p.stacked_axes == 0);
        }
        if (p.name == "embedding/table") {
            saw_embedding = true;
            CHECK(p.role == olmax::nn::Role::embedding);
            CHECK(p.unit_axis == 0);
        }
        if (p.name.rfind("head/", 0) == 0) saw_head = true;
    }
    CHECK(stacked == named.size());
    CHECK(saw_embedding);
    CHECK(saw_head);
    // Handles, not copies: an update through the optimiser's view is the model's parameter.
    params.front().tensor.data()[0] = 42.0f;
    CHECK(optim::parameters_of(model).front().tensor.data()[0] == 42.0f);
    // A prefix names a model placed inside something larger.
    CHECK(optim::parameters_of(model, "lm").front().name == "lm/" + params.front().name);
}

namespace {

olmax::data::Batch random_bytes(std::size_t rows, std::size_t sequence, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    olmax::data::Batch b;
    b.inputs = Tensor<std::int32_t>({rows, sequence});
    b.targets = Tensor<std::int32_t>({rows, sequence});
    b.mask = Tensor<float>({rows, sequence}, 1.0f);
    for (std::size_t i = 0; i < rows * sequence; ++i) {
        b.inputs.data()[i] = byte(rng);
        b.targets.data()[i] = byte(rng);
    }
    b.real_targets = rows * sequence;
    return b;
}

/// AdamW with unit-wise AGC at `agc_clip` and global-norm clipping at `max_grad_norm` (0: off).
optim::AdamWConfig test_adamw(double agc_clip = 0, double max_grad_norm = 0,
                              optim::MomentPrecision moments = optim::MomentPrecision::float64) {
    optim::AdamWConfig c;
    c.moments = moments;
    c.schedule.peak_lr = 3e-3;
    c.beta2 = 0.99;
    c.weight_decay = 0.01;
    c.agc.clip = agc_clip;
    c.max_grad_norm = max_grad_norm;
    return c;
}

/// Two identical models with their optimisers: one steps after backward, one during it.
struct SeparateAndDuring {
    SeparateAndDuring(const olmax::models::ByteLMConfig& config, std::size_t kept, double agc_clip = 0, double max_grad_norm = 0,
                      optim::MomentPrecision moments = optim::MomentPrecision::float64)
        : reference(config), fused(config), reference_opt(optim::parameters_of(reference), test_adamw(agc_clip, max_grad_norm, moments)),
          fused_opt(optim::parameters_of(fused), test_adamw(agc_clip, max_grad_norm, moments)) {
        reference.stack.keep_activations(kept);
        fused.stack.keep_activations(kept);
    }
    olmax::models::ByteLM<> reference, fused;
    optim::AdamW<float> reference_opt;
    optim::AdamW<float> fused_opt;
};

}  // namespace

TEST_CASE("optim: step_during_backward updates as backward + step + zero_grad, and drops every gradient", "[optim]") {
    olmax::models::ByteLMConfig config;
    config.features = 8;
    config.depth = 3;
    // One shard (the whole backward on this thread) and two (data_parallel_backward's shards report
    // to the caller's hook once summed); all layers recomputed, and the first one keeping its
    // activations; with unit-wise AGC (applied per parameter or layer slice during backward, to
    // every gradient at once by step(); at 0.01 it clips units of every step) and without.
    // Without global-norm clipping the results are step()'s bit for bit. With it (0.05, below every
    // step's norm) backward runs twice, and the stack hands its parameters over in layer slices, so
    // the norm is summed per slice: it may differ from step()'s in the last bits, and the updates by
    // the rounding of the clip factor. The first moments carry the factor itself ((1 - beta1) g c in
    // the first step), so they are compared at 1e-9: a wrong factor moves them by its own error.
    // float32 moments (computed in float) the same way, without AGC. bfloat16 moments without AGC or
    // clipping, bit for bit: a layer slice's elements draw the random bits of their place in the
    // whole parameter, so the stochastic rounding is step()'s.
    for (const auto moments : {optim::MomentPrecision::float64, optim::MomentPrecision::float32, optim::MomentPrecision::bfloat16})
    for (const double max_grad_norm : {0.0, 0.05})
        for (const double agc_clip : {0.0, 0.01})
            for (const std::size_t shards : {std::size_t(1), std::size_t(2)})
                for (const std::size_t kept : {std::size_t(0), std::size_t(1)}) {
                    if (moments != optim::MomentPrecision::float64 && agc_clip > 0) continue;
                    if (moments == optim::MomentPrecision::bfloat16 && max_grad_norm > 0) continue;
                    INFO("max_grad_norm " << max_grad_norm << ", AGC " << agc_clip << ", shards " << shards << ", kept layers " << kept
                                          << ", moments " << int(moments) << " (0 float64, 1 float32, 2 bfloat16)");
                    SeparateAndDuring models(config, kept, agc_clip, max_grad_norm, moments);
                    auto& [reference, fused, reference_opt, fused_opt] = models;
                    for (std::uint64_t step = 0; step < 3; ++step) {
                        const auto batch = random_bytes(4, 16, 100 + step);
                        const double reference_loss = reference.accumulate_gradients(batch, shards, 1.0);
                        const auto reference_report = reference_opt.step();
                        reference_opt.zero_grad();
                        double fused_loss = 0;
                        int runs = 0;
                        const auto report = fused_opt.step_during_backward([&] {
                            ++runs;
                            fused_loss = fused.accumulate_gradients(batch, shards, 1.0);
                        });
                        CHECK(runs == (max_grad_norm > 0 ? 2 : 1));
                        CHECK(fused_loss == reference_loss);
                        CHECK(report.step == std::int64_t(step + 1));
                        if (max_grad_norm > 0) CHECK(reference_report.grad_norm > 2 * max_grad_norm);  // the clip changes every step
                        CHECK(report.grad_norm == Approx(reference_report.grad_norm).epsilon(1e-12));  // after AGC in both
                        CHECK(report.agc_clipped_units == reference_report.agc_clipped_units);
                        if (agc_clip > 0) CHECK(report.agc_clipped_units > 0);
                        CHECK(fused_opt.step_count() == reference_opt.step_count());
                    }
                    const auto want = reference_opt.parameters();
                    const auto got = fused_opt.parameters();
                    const auto want_state = reference_opt.export_state(), got_state = fused_opt.export_state();
                    REQUIRE(want.size() == got.size());
                    for (std::size_t i = 0; i < want.size(); ++i) {
                        INFO(want[i].name);
                        CHECK_FALSE(got[i].tensor.grad().defined());
                        CHECK(want_state.slots[i].step == got_state.slots[i].step);
                        if (max_grad_norm == 0) {
                            CHECK(same_bits(want[i].tensor, got[i].tensor));
                            CHECK(std::memcmp(want_state.slots[i].second_moment.data(), got_state.slots[i].second_moment.data(),
                                              want_state.slots[i].second_moment.size() * sizeof(double)) == 0);
                            continue;
                        }
                        double worst_param = 0, worst_moment = 0;
                        for (std::size_t e = 0; e < want[i].tensor.size(); ++e) {
                            const double p = want[i].tensor.data()[e], q = got[i].tensor.data()[e];
                            worst_param = std::max(worst_param, std::abs(p - q) / (std::abs(p) + 1e-3));
                            const double m = want_state.slots[i].first_moment.data()[e], n = got_state.slots[i].first_moment.data()[e];
                            worst_moment = std::max(worst_moment, std::abs(m - n) / (std::abs(m) + 1e-30));
                        }
                        CHECK(worst_param <= 1e-6);
                        CHECK(worst_moment <= 1e-9);
                    }
                }
}

TEST_CASE("optim: step_during_backward never holds all gradients at once", "[optim]") {
    olmax::models::ByteLMConfig config;
    config.features = 32;
    config.depth = 6;
    // Two shards run at once only with two threads; on one they run one after the other and every
    // slice waits for the second shard (correct, no saving), so that case is measured only with two.
    std::vector<std::size_t> shard_counts{1};
    if (olmax::backend::current().num_threads() >= 2) shard_counts.push_back(2);
    // With global-norm clipping each backward runs twice, and each run drops what it finishes.
    for (const double max_grad_norm : {0.0, 1.0})
    for (const std::size_t shards : shard_counts)
        for (const std::size_t kept : {std::size_t(0), std::size_t(3)}) {  // all layers recomputed; half keeping their activations
            INFO("max_grad_norm " << max_grad_norm << ", shards " << shards << ", kept layers " << kept);
            SeparateAndDuring models(config, kept, 0, max_grad_norm);
            auto& [reference, fused, reference_opt, fused_opt] = models;
            std::size_t gradient_bytes = 0;
            for (const auto& p : fused_opt.parameters()) gradient_bytes += p.tensor.size() * sizeof(float);
            const auto batch = random_bytes(2, 16, 7);
            auto step_peak = [](auto&& step) {  // tensor bytes a step adds at its highest
                const std::size_t before = olmax::memory::stats().current_bytes;
                olmax::memory::reset_peak();
                step();
                return olmax::memory::stats().peak_bytes - before;
            };
            for (int round = 0; round < 2; ++round) {  // the second round is measured (moments and caches exist)
                const std::size_t separate = step_peak([&] {
                    reference.accumulate_gradients(batch, shards, 1.0);
                    reference_opt.step();
                    reference_opt.zero_grad();
                });
                const std::size_t during = step_peak([&] { fused_opt.step_during_backward([&] { fused.accumulate_gradients(batch, shards, 1.0); }); });
                INFO("step peak: separate " << separate << " B, during backward " << during << " B; gradients " << gradient_bytes << " B");
                // The separate step holds every gradient at its end; updating during backward frees
                // each layer's slice of the stacked gradients before the next layer's are made.
                if (round == 1) CHECK(during + gradient_bytes / 2 < separate);
            }
        }
}

TEST_CASE("optim: step_during_backward with global-norm clipping runs backward twice and updates as the clipped step()", "[optim]") {
    // Two parameters handed over whole (no slices), so the norm is summed as step() sums it and the
    // updates agree bit for bit; the norm is above the clip (1) in every step.
    auto make = [] {
        return std::pair{olmax::parameter(Tensor<double>::from({2}, {1.0, 2.0})), olmax::parameter(Tensor<double>::from({1}, {5.0}))};
    };
    auto [w_ref, u_ref] = make();
    auto [w, u] = make();
    const optim::AdamWConfig clipped = test_adamw(0, 1.0);
    optim::AdamW<double> reference({optim::make_parameter("w", olmax::nn::Role::weight, w_ref), optim::make_parameter("u", olmax::nn::Role::weight, u_ref)},
                                   clipped);
    optim::AdamW<double> fused({optim::make_parameter("w", olmax::nn::Role::weight, w), optim::make_parameter("u", olmax::nn::Role::weight, u)}, clipped);
    auto loss_of = [](const Tensor<double>& a, const Tensor<double>& b) {  // gradients (3, 3) and 0.8 b: a norm above 4
        return olmax::sum(a * 3.0) + olmax::sum(b * b) * (4.0 / 10.0);
    };
    for (int step = 0; step < 3; ++step) {
        loss_of(w_ref, u_ref).backward();
        const auto want = reference.step();
        reference.zero_grad();
        int runs = 0;
        const auto got = fused.step_during_backward([&] {
            ++runs;
            loss_of(w, u).backward();
        });
        CHECK(runs == 2);
        CHECK(got.grad_norm == want.grad_norm);
        CHECK(got.grad_norm > 1.0);  // clipping is on in every step
        for (std::size_t i = 0; i < 2; ++i) CHECK(w(i) == w_ref(i));
        CHECK(u(0) == u_ref(0));
        CHECK_FALSE(w.grad().defined());
        CHECK_FALSE(u.grad().defined());
    }
    CHECK(fused.step_count() == 3);

    SECTION("a gradient accumulated before the step is refused before backward runs") {
        (w * 1.0).backward(Tensor<double>::from({2}, {1.0, 1.0}));
        bool ran = false;
        CHECK_THROWS_WITH(fused.step_during_backward([&] { ran = true; }), Catch::Contains("already holds a gradient"));
        CHECK_FALSE(ran);
        CHECK(fused.step_count() == 3);
    }
    SECTION("a NaN is found by the first run: nothing is updated") {
        const double w0 = w(0), u0 = u(0);
        CHECK_THROWS_AS(fused.step_during_backward([&] {
            (u * 1.0).backward(Tensor<double>::from({1}, {1.0}));  // u is final first and finite
            (w * 1.0).backward(Tensor<double>::from({2}, {1.0, std::nan("")}));
        }),
                        optim::non_finite_gradient);
        CHECK(w(0) == w0);
        CHECK(u(0) == u0);
        CHECK(fused.step_count() == 3);
    }
    SECTION("a backward that gives other gradients the second time is reported") {
        int runs = 0;
        CHECK_THROWS_WITH(fused.step_during_backward([&] {
            ++runs;
            loss_of(w, u * double(runs)).backward();
        }),
                          Catch::Contains("must be deterministic"));
        CHECK(runs == 2);
    }
}

TEST_CASE("optim: step_during_backward reports non-finite gradients and leaves parameters without one alone", "[optim]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1.0, 2.0}));
    auto u = olmax::parameter(Tensor<double>::from({1}, {5.0}));
    optim::AdamW<double> opt({optim::make_parameter("w", olmax::nn::Role::weight, w), optim::make_parameter("u", olmax::nn::Role::weight, u)},
                             optim::AdamWConfig{});
    CHECK_THROWS_AS(opt.step_during_backward([&] { (w * 1.0).backward(Tensor<double>::from({2}, {1.0, std::nan("")})); }),
                    optim::non_finite_gradient);
    CHECK(opt.step_count() == 0);
    CHECK(w(0) == 1.0);  // the parameter with the NaN gradient is not updated
    CHECK(w(1) == 2.0);
    opt.zero_grad();
    // A parameter no gradient reaches is left alone, as in step().
    const auto report = opt.step_during_backward([&] { (w * 2.0).backward(Tensor<double>::from({2}, {1.0, 1.0})); });
    CHECK(report.step == 1);
    CHECK(report.grad_norm == Approx(std::sqrt(8.0)));
    CHECK(w(0) != 1.0);
    CHECK(u(0) == 5.0);
    CHECK(opt.export_state().slots[1].step == 0);
    CHECK_FALSE(w.grad().defined());
}

TEST_CASE("AdamW takes the learning rate as its second argument, once", "[errors][optim]") {
    olmax::Generator rng(2);
    olmax::nn::Linear<double> layer(2, 2, rng);
    optim::AdamW<double> constant(optim::parameters_of(layer), 0.05);
    CHECK(constant.next_lr() == 0.05);
    optim::AdamW<double> with_rest(optim::parameters_of(layer), 0.05, {.weight_decay = 0.1});
    CHECK(with_rest.config().weight_decay == 0.1);
    CHECK(with_rest.config().schedule.peak_lr == 0.05);
    CHECK(optim::AdamW<double>(optim::parameters_of(layer), {}).next_lr() == optim::LrSchedule{}.peak_lr);  // {} is still the default config
    CHECK_THROWS_WITH(optim::AdamW<double>(optim::parameters_of(layer), 0.05, {.schedule = {.peak_lr = 0.2}}),
                      Catch::Contains("the learning rate is given twice, lr=0.05 and config.schedule.peak_lr=0.2"));
}
