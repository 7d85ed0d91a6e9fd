// Semantics of the tape: accumulation, zeroing, no_grad, lifetime, nesting, custom backward passes
// (custom_op and Function<Op>) and per-thread tapes.
#include "test_helpers.hpp"

#include <algorithm>
#include <thread>

using olmax::Tensor;
using olmax::autodiff::GradientSink;
namespace ad = olmax::autodiff;

TEST_CASE("gradients accumulate across two backward calls; zero_grad resets", "[autodiff]") {
    auto w = olmax::parameter(Tensor<double>::from({3}, {1, 2, 3}));
    auto step = [&] { olmax::sum(olmax::square(w)).backward(); };
    step();
    for (std::size_t i = 0; i < 3; ++i) CHECK(w.grad()(i) == 2 * w(i));
    step();
    for (std::size_t i = 0; i < 3; ++i) CHECK(w.grad()(i) == 4 * w(i));
    w.zero_grad();
    CHECK_FALSE(w.grad().defined());
    step();
    for (std::size_t i = 0; i < 3; ++i) CHECK(w.grad()(i) == 2 * w(i));
}

TEST_CASE("a leaf used twice (x * x) and along two paths gets the sum of both contributions", "[autodiff]") {
    auto x = olmax::parameter(Tensor<double>::from({2}, {3, -1}));
    olmax::sum(x * x).backward();
    CHECK(x.grad()(0) == 6);
    CHECK(x.grad()(1) == -2);
    x.zero_grad();
    auto h = olmax::exp(x);
    olmax::sum(h * x + h).backward();  // d/dx (e^x x + e^x) = e^x (x + 2)
    CHECK(x.grad()(0) == Approx(std::exp(3.0) * 5));
    CHECK(x.grad()(1) == Approx(std::exp(-1.0) * 1));
}

TEST_CASE("no_grad records nothing and its results do not require grad", "[autodiff]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    const std::size_t before = ad::tape_size();
    Tensor<double> y;
    {
        ad::no_grad guard;
        CHECK_FALSE(ad::is_grad_enabled());
        y = olmax::sum(olmax::exp(w) * w);
        {
            ad::enable_grad inner;  // explicit opt back in, e.g. a recomputing backward
            CHECK(ad::is_grad_enabled());
        }
        CHECK_FALSE(ad::is_grad_enabled());
    }
    CHECK(ad::is_grad_enabled());
    CHECK(ad::tape_size() == before);
    CHECK_FALSE(y.requires_grad());
    CHECK_THROWS_AS(y.backward(), olmax::autodiff_error);
}

TEST_CASE("ops on constants record nothing", "[autodiff]") {
    const std::size_t before = ad::tape_size();
    auto y = olmax::matmul(Tensor<double>({2, 3}, 1.0), Tensor<double>({3, 2}, 1.0));
    CHECK(ad::tape_size() == before);
    CHECK(y.is_leaf());
    CHECK_FALSE(y.requires_grad());
}

TEST_CASE("backward frees the tape; a stale graph throws autodiff_error; retain_graph keeps it", "[autodiff]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    SECTION("freed") {
        auto h = olmax::exp(w);
        auto loss = olmax::sum(h);
        CHECK(ad::tape_size() == 2);
        loss.backward();
        CHECK(ad::tape_size() == 0);
        CHECK_THROWS_AS(loss.backward(), olmax::autodiff_error);   // second backward through a freed graph
        CHECK_THROWS_AS(olmax::sum(h), olmax::autodiff_error);     // new op on a tensor of the freed graph
        CHECK_THROWS_AS(h * w, olmax::autodiff_error);
        // The failed backward left no partial gradient behind.
        CHECK(w.grad()(0) == Approx(std::exp(1.0)));
        // A leaf is never stale: a fresh graph from it works.
        olmax::sum(olmax::exp(w)).backward();
        CHECK(w.grad()(0) == Approx(2 * std::exp(1.0)));
    }
    SECTION("retain_graph") {
        auto loss = olmax::sum(olmax::exp(w));
        loss.backward(/*retain_graph=*/true);
        CHECK(ad::tape_size() == 2);
        loss.backward();
        CHECK(w.grad()(1) == Approx(2 * std::exp(2.0)));
        CHECK(ad::tape_size() == 0);
    }
    SECTION("clear_tape") {
        auto h = olmax::exp(w);
        ad::clear_tape();
        CHECK(ad::tape_size() == 0);
        CHECK_THROWS_AS(olmax::sum(h).backward(), olmax::autodiff_error);
    }
}

TEST_CASE("backward frees what each node saved once the node has run, unless retain_graph", "[autodiff]") {
    // Two custom ops, each saving a 1 MiB tensor: `early` runs first in the forward and last in
    // backward. When its closure runs, `late`'s closure has run and (without retain_graph) freed
    // its saved tensor; with retain_graph both are still held.
    constexpr std::size_t n = std::size_t(1) << 17;  // doubles: 1 MiB
    auto x = olmax::parameter(Tensor<double>({n}, 1.0));
    auto saving_op = [](const char* name, const Tensor<double>& in, std::size_t* held_at_run) {
        auto saved = Tensor<double>(in.shape(), 2.0);  // the derivative its backward reads
        return ad::custom_op(name, olmax::scale(in.detach(), 2.0), {in},
                             [saved, held_at_run](const Tensor<double>& dy, GradientSink<double>& g) {
                                 if (held_at_run) *held_at_run = olmax::memory::stats().current_bytes;
                                 g.add(0, olmax::map([](double s, double d) { return s * d; }, saved, dy));
                             });
    };
    for (const bool retain : {false, true}) {
        CAPTURE(retain);
        x.zero_grad();
        std::size_t held_in_early = 0, held_in_late = 0;
        auto y = saving_op("early", x, &held_in_early);
        auto z = saving_op("late", y, &held_in_late);
        auto loss = olmax::sum(z);
        loss.backward(retain);
        // Between the two closures z's gradient (1 MiB) was freed and y's (1 MiB) made, either way;
        // `late`'s saved 1 MiB was freed too exactly when the graph is not retained.
        CHECK(held_in_late > 0);
        const std::ptrdiff_t change = std::ptrdiff_t(held_in_early) - std::ptrdiff_t(held_in_late);
        CHECK(change == (retain ? 0 : -std::ptrdiff_t(n * sizeof(double))));
        CHECK(x.grad()(0) == 4.0);
        if (retain) {
            loss.backward();  // the retained graph runs again, with what it saved
            CHECK(x.grad()(0) == 8.0);
        }
    }
}

TEST_CASE("GradientSink::take_grad_output hands the incoming gradient over, once", "[autodiff]") {
    auto x = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    bool checked = false;
    auto y = ad::custom_op<double>("takes", {olmax::scale(x.detach(), 3.0)}, {x},
                                   [&checked](std::span<const Tensor<double>> g, GradientSink<double>& sink) {
                                       Tensor<double> dy = sink.take_grad_output(0);
                                       CHECK_FALSE(g[0].defined());  // the node no longer holds it
                                       CHECK_THROWS_WITH(sink.take_grad_output(0), Catch::Contains("taken already"));
                                       CHECK_THROWS_AS(sink.take_grad_output(1), olmax::autodiff_error);
                                       sink.add(0, olmax::scale(dy, 3.0));
                                       checked = true;
                                   })[0];
    olmax::sum(olmax::square(y)).backward();
    CHECK(checked);
    CHECK(x.grad()(1) == 36.0);  // d/dx (3x)^2 = 18 x
}

TEST_CASE("a backward that threw part-way cannot be rerun on the nodes it already ran", "[autodiff][errors]") {
    // Before nodes freed what they saved, a rerun added the gradient of the nodes that had run twice.
    auto x = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    bool fail = true;
    auto failing = ad::custom_op("fails_once", olmax::scale(x.detach(), 1.0), {x}, [&fail](const Tensor<double>& dy, GradientSink<double>& g) {
        if (fail) throw olmax::value_error("fails_once: backward failed");
        g.add(0, dy);
    });
    auto loss = olmax::sum(olmax::square(failing));
    CHECK_THROWS_AS(loss.backward(), olmax::value_error);
    fail = false;
    CHECK_THROWS_WITH(loss.backward(), Catch::Contains("already ran in an earlier backward"));
    CHECK_FALSE(x.grad().defined());
    ad::clear_tape();
}

TEST_CASE("memory::profile_peak names the ops whose buffers make up a step's peak", "[autodiff][memory]") {
    constexpr std::size_t n = std::size_t(1) << 15;  // doubles: 256 KiB
    constexpr std::size_t kib256 = n * sizeof(double);
    auto x = olmax::parameter(Tensor<double>({n}, 0.5));
    auto before = Tensor<double>({n}, 1.0);  // made before the profile: not counted, even when freed inside
    const auto profile = olmax::memory::profile_peak([&] {
        before = Tensor<double>();
        auto y = olmax::exp(x);          // exp keeps its output for backward
        auto z = olmax::mul(y, y);       // mul keeps both inputs (y, twice)
        olmax::sum(z).backward();        // backward of mul makes dy * y twice, then x's gradient
    });
    INFO(profile.table());
    std::size_t total = 0;
    for (const auto& e : profile.entries) total += e.bytes;
    CHECK(total == profile.peak_bytes);
    auto bytes_of = [&](const std::string& label) {
        for (const auto& e : profile.entries)
            if (e.label == label) return e.bytes;
        return std::size_t(0);
    };
    // The peak is inside mul's backward: exp's output y, mul's output z and sum's gradient of z are
    // live, with what mul's backward has made by then (256 KiB each; the scalars add a few bytes).
    CHECK(bytes_of("exp") == kib256);
    CHECK(bytes_of("mul") == kib256);
    CHECK(bytes_of("backward of sum") == kib256);
    CHECK(bytes_of("backward of mul") >= kib256);
    CHECK(profile.peak_bytes >= 4 * kib256);
    CHECK(profile.peak_bytes < 6 * kib256 + 1024);
    CHECK(profile.table().find("in all at the peak") != std::string::npos);
    // A throwing call ends the profile; the next one starts clean.
    CHECK_THROWS_AS(olmax::memory::profile_peak([] { throw olmax::value_error("inside a profile"); }), olmax::value_error);
    CHECK_THROWS_WITH(olmax::memory::profile_peak([] { olmax::memory::profile_peak([] {}); }), Catch::Contains("already running"));
    const auto empty = olmax::memory::profile_peak([] {});
    CHECK(empty.peak_bytes == 0);
    CHECK(empty.entries.empty());
}

TEST_CASE("profile_time splits a call's time into ops, backward nodes and the rest", "[autodiff][memory]") {
    constexpr std::size_t n = std::size_t(1) << 16;
    auto x = olmax::parameter(Tensor<double>({n}, 0.5));
    volatile double host = 0;
    // One thread (the serial kernels), so the self times can add up to the wall time below; on the
    // parallel kernels the ops' chunks on the other threads count too (a loaded machine showed 4% more).
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    const auto profile = olmax::profile_time([&] {
        auto y = olmax::exp(x);
        auto z = olmax::mul(y, y);
        olmax::sum(z).backward();
        for (int i = 0; i < 100000; ++i) host = host + 1.0;  // host work outside every op
    });
    INFO(profile.table());
    auto entry = [&](const std::string& label) {
        for (const auto& e : profile.entries)
            if (e.label == label) return e;
        return olmax::TimeEntry{};
    };
    CHECK(entry("exp").calls == 1);
    CHECK(entry("mul").calls == 1);
    CHECK(entry("sum").calls == 1);
    CHECK(entry("backward of mul").calls == 1);
    CHECK(entry("backward of exp").calls == 1);
    CHECK(entry("outside any op").calls == 1);
    CHECK(entry("outside any op").seconds > 0);
    for (const auto& e : profile.entries) CHECK(e.seconds >= 0);
    // Largest first, and on one thread the self times add up to the wall time (the umbrella entry
    // takes what no op took).
    CHECK(std::is_sorted(profile.entries.begin(), profile.entries.end(),
                         [](const olmax::TimeEntry& a, const olmax::TimeEntry& b) { return a.seconds > b.seconds; }));
    CHECK(profile.total_seconds() == Approx(profile.wall_seconds).epsilon(0.02).margin(1e-5));
    CHECK(profile.seconds_of("mul") >= entry("mul").seconds + entry("backward of mul").seconds);
    CHECK(profile.table().find("wall") != std::string::npos);
    // One at a time; a throwing call ends the profile.
    CHECK_THROWS_WITH(olmax::profile_time([] { olmax::profile_time([] {}); }), Catch::Contains("already running"));
    CHECK_THROWS_AS(olmax::profile_time([] { throw olmax::value_error("inside a profile"); }), olmax::value_error);
    const auto empty = olmax::profile_time([] {});
    REQUIRE(empty.entries.size() == 1);
    CHECK(empty.entries[0].label == "outside any op");
}

TEST_CASE("backward on a non-scalar needs a grad_output of the same shape", "[autodiff][errors]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto y = olmax::scale(w, 3.0);
    CHECK_THROWS_AS(y.backward(), olmax::shape_error);
    CHECK_THROWS_AS(y.backward(Tensor<double>({3})), olmax::error);
    y.backward(Tensor<double>::from({2}, {1, 10}));
    CHECK(w.grad()(0) == 3);
    CHECK(w.grad()(1) == 30);
}

TEST_CASE("set_requires_grad on a non-leaf throws; intermediate grads are freed unless retained", "[autodiff]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto h = olmax::scale(w, 2.0);
    auto kept = olmax::scale(w, 3.0).retain_grad();
    CHECK_THROWS_AS(h.set_requires_grad(false), olmax::autodiff_error);
    olmax::sum(h * kept).backward();
    CHECK_FALSE(h.grad().defined());
    REQUIRE(kept.grad().defined());
    CHECK(kept.grad()(1) == 4);  // d/dkept (h * kept) = h = 2w
}

TEST_CASE("custom_op: single output, lambda backward", "[autodiff][custom]") {
    auto cube = [](const std::vector<Tensor<double>>& v) {
        const Tensor<double>& x = v[0];
        auto value = olmax::map([](double a) { return a * a * a; }, x);
        return ad::custom_op("cube", value, {x}, [x = x.detach()](const Tensor<double>& dy, GradientSink<double>& g) {
            g.add(0, olmax::map([](double a, double d) { return 3 * a * a * d; }, x, dy));
        });
    };
    olmax::Generator rng(31);
    olmax_test::check_gradients(cube, {olmax::randn<double>({3, 4}, rng)});
    // Under no_grad (or on constants) the value comes back unrecorded.
    auto c = cube({Tensor<double>::from({1}, {2})});
    CHECK(c(0) == 8);
    CHECK_FALSE(c.requires_grad());
}

TEST_CASE("custom_op: multi-output; an unused output gets zeros in backward and no grad", "[autodiff][custom]") {
    auto x = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto y = olmax::parameter(Tensor<double>::from({2}, {3, 5}));
    bool saw_zero_for_unused = false;
    auto outs = ad::custom_op<double>("sum_and_product", {olmax::map([](double a, double b) { return a + b; }, x, y),
                                                          olmax::map([](double a, double b) { return a * b; }, x, y)},
                                      {x, y},
                                      [&, xd = x.detach(), yd = y.detach()](std::span<const Tensor<double>> g, GradientSink<double>& sink) {
                                          REQUIRE(g.size() == 2);
                                          saw_zero_for_unused = g[1].defined() && g[1](0) == 0 && g[1](1) == 0;
                                          sink.add(0, g[0] + g[1] * yd);
                                          sink.add(1, g[0] + g[1] * xd);
                                      });
    REQUIRE(outs.size() == 2);
    CHECK(outs[0].requires_grad());
    CHECK(outs[1].requires_grad());
    olmax::sum(outs[0]).backward();
    CHECK(saw_zero_for_unused);
    CHECK_FALSE(outs[1].grad().defined());
    CHECK(x.grad()(0) == 1);
    CHECK(y.grad()(1) == 1);

    // The same op through the gradient checker, both outputs used.
    auto both = [](const std::vector<Tensor<double>>& v) {
        auto o = ad::custom_op<double>("sum_and_product", {olmax::map([](double a, double b) { return a + b; }, v[0], v[1]),
                                                           olmax::map([](double a, double b) { return a * b; }, v[0], v[1])},
                                       {v[0], v[1]},
                                       [a = v[0].detach(), b = v[1].detach()](std::span<const Tensor<double>> g, GradientSink<double>& sink) {
                                           if (sink.needs(0)) sink.add(0, g[0] + g[1] * b);
                                           if (sink.needs(1)) sink.add(1, g[0] + g[1] * a);
                                       });
        return o[0] * o[1];
    };
    olmax::Generator rng(32);
    olmax_test::check_gradients(both, {olmax::randn<double>({3}, rng), olmax::randn<double>({3}, rng)});
    olmax_test::check_gradients(both, {olmax::randn<double>({3}, rng), olmax::randn<double>({3}, rng)}, {.skip_inputs = {1}});
}

TEST_CASE("an input that needs no grad gets no sink slot", "[autodiff][custom]") {
    auto x = olmax::parameter(Tensor<double>::from({1}, {2}));
    const auto c = Tensor<double>::from({1}, {5});
    bool needs0 = false, needs1 = true;
    auto y = ad::custom_op("probe", (x * c).detach(), {x, c}, [&](const Tensor<double>& dy, GradientSink<double>& g) {
        needs0 = g.needs(0);
        needs1 = g.needs(1);
        g.add(0, dy * c);
        g.add(1, dy);  // ignored: c does not require grad
    });
    y.backward();
    CHECK(needs0);
    CHECK_FALSE(needs1);
    CHECK(x.grad()(0) == 5);
    CHECK_FALSE(c.grad().defined());
}

namespace {

/// y = x^2 * w + s * x (s a plain double), two outputs: y and y * 2.
struct PolyWithState : ad::Function<PolyWithState> {
    template <class T>
    static std::vector<Tensor<T>> forward(ad::Context<T>& ctx, const Tensor<T>& x, const Tensor<T>& w, double s) {
        ctx.save_for_backward(x, w);
        ctx.saved_data["s"] = s;
        CHECK_FALSE(ad::is_grad_enabled());  // forward runs unrecorded
        auto y = olmax::map([s](T a, T b) { return a * a * b + T(s) * a; }, x, w);
        return {y, olmax::scale(y, T{2})};
    }
    template <class T>
    static std::vector<Tensor<T>> backward(ad::Context<T>& ctx, std::vector<Tensor<T>> dy) {
        const auto& x = ctx.saved_tensors()[0];
        const auto& w = ctx.saved_tensors()[1];
        const double s = std::any_cast<double>(ctx.saved_data.at("s"));
        auto g = dy[0] + olmax::scale(dy[1], T{2});
        Tensor<T> dx, dw;
        if (ctx.needs_input_grad(0)) dx = g * olmax::map([s](T a, T b) { return T{2} * a * b + T(s); }, x, w);
        if (ctx.needs_input_grad(1)) dw = g * x * x;
        return {dx, dw};
    }
};

struct Cube : ad::Function<Cube> {
    template <class T>
    static Tensor<T> forward(ad::Context<T>& ctx, const Tensor<T>& x) {
        ctx.save_for_backward(x);
        return x * x * x;
    }
    template <class T>
    static std::vector<Tensor<T>> backward(ad::Context<T>& ctx, std::vector<Tensor<T>> dy) {
        const auto& x = ctx.saved_tensors()[0];
        return {olmax::scale(x * x * dy[0], T{3})};
    }
};

struct WrongArity : ad::Function<WrongArity> {
    template <class T>
    static Tensor<T> forward(ad::Context<T>&, const Tensor<T>& x) { return x.clone(); }
    template <class T>
    static std::vector<Tensor<T>> backward(ad::Context<T>&, std::vector<Tensor<T>> dy) { return {dy[0], dy[0]}; }
};

}  // namespace

TEST_CASE("Function<Op>: save_for_backward, saved_data, needs_input_grad, multi-output", "[autodiff][custom]") {
    olmax::Generator rng(33);
    const std::vector<Tensor<double>> in{olmax::randn<double>({2, 3}, rng), olmax::randn<double>({2, 3}, rng)};
    auto f = [](const std::vector<Tensor<double>>& v) {
        auto outs = PolyWithState::apply(v[0], v[1], 0.75);
        return outs[0] * outs[1];
    };
    olmax_test::check_gradients(f, in);
    olmax_test::check_gradients(f, in, {.skip_inputs = {0}});
    olmax_test::check_gradients(f, in, {.skip_inputs = {1}});
    olmax_test::check_gradients([](const std::vector<Tensor<double>>& v) { return Cube::apply(v[0]); }, {in[0]});

    SECTION("constant inputs: no record, plain values") {
        const std::size_t before = ad::tape_size();
        auto y = Cube::apply(Tensor<double>::from({1}, {2}));
        CHECK(y(0) == 8);
        CHECK(ad::tape_size() == before);
    }
    SECTION("float works too") {
        auto x = olmax::parameter(Tensor<float>::from({1}, {2}));
        Cube::apply(x).backward();
        CHECK(x.grad()(0) == 12.0f);
    }
    SECTION("a backward with the wrong number of gradients throws") {
        auto x = olmax::parameter(Tensor<double>::from({1}, {2}));
        CHECK_THROWS_AS(WrongArity::apply(x).backward(), olmax::autodiff_error);
        ad::clear_tape();
    }
}

TEST_CASE("tape_scope: a nested tape differentiates its own ops; gradients reach outer tensors", "[autodiff]") {
    auto w = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto outer = olmax::scale(w, 3.0);  // recorded on the enclosing tape
    const std::size_t outer_size = ad::tape_size();
    {
        ad::tape_scope scope;
        CHECK(ad::tape_size() == 0);
        auto inner = olmax::sum(olmax::square(outer));  // d/d outer = 2 outer = 6 w
        CHECK(ad::tape_size() == 2);
        inner.backward();
        CHECK(ad::tape_size() == 0);
        // The gradient stopped at `outer` (an enclosing-tape tensor): w has nothing yet.
        CHECK_FALSE(w.grad().defined());
    }
    CHECK(ad::tape_size() == outer_size);
    // The outer backward carries the accumulated gradient of `outer` down to w (x3), plus its own seed.
    olmax::sum(outer).backward();
    CHECK(w.grad()(0) == Approx(3 * (6 * 1 + 1)));
    CHECK(w.grad()(1) == Approx(3 * (6 * 2 + 1)));

    SECTION("a tensor of a popped scope is stale; backward of an outer tensor inside a scope throws") {
        Tensor<double> escaped;
        auto o = olmax::exp(w);
        {
            ad::tape_scope scope;
            escaped = olmax::exp(w);
            CHECK_THROWS_AS(o.backward(Tensor<double>({2}, 1.0)), olmax::autodiff_error);  // o lives on the outer tape
            CHECK_FALSE(o.grad().defined());  // the refused backward left no seed behind
        }
        CHECK_THROWS_AS(olmax::sum(escaped), olmax::autodiff_error);
        ad::clear_tape();
    }
    SECTION("scopes nest") {
        w.zero_grad();
        {
            ad::tape_scope a;
            auto h = olmax::scale(w, 2.0);
            {
                ad::tape_scope b;
                olmax::sum(olmax::scale(h, 5.0)).backward();
            }
            olmax::sum(h).backward();  // h's grad: 5 (from b) + 1
        }
        CHECK(w.grad()(0) == Approx(12));
    }
}

TEST_CASE("per-thread tapes: concurrent graphs on two std::threads", "[autodiff][threads]") {
    auto work = [](double seed_value, double* result, bool* ok) {
        try {
            auto w = olmax::parameter(Tensor<double>({64, 64}, seed_value));
            for (int step = 0; step < 20; ++step) {
                auto loss = olmax::mean(olmax::square(olmax::matmul(w, w)));
                loss.backward();
                if (olmax::autodiff::tape_size() != 0) *ok = false;
            }
            *result = w.grad()(0, 0);
        } catch (...) {
            *ok = false;
        }
    };
    double r1 = 0, r2 = 0;
    bool ok1 = true, ok2 = true;
    const std::size_t main_tape = ad::tape_size();
    auto w_main = olmax::parameter(Tensor<double>({2}, 1.0));
    auto pending = olmax::exp(w_main);  // the main thread's tape holds a node while the others run
    std::thread t1(work, 0.01, &r1, &ok1), t2(work, 0.02, &r2, &ok2);
    t1.join();
    t2.join();
    CHECK(ok1);
    CHECK(ok2);
    // d/dw mean((w w)^2) for constant w = c: (w w) = 64 c^2 everywhere; grad = 20 steps * 2/N * 2 * 64 * c * 64 c^2.
    auto expect = [](double c) { return 20 * (2.0 / (64 * 64)) * (2 * 64 * c * (64 * c * c)); };
    CHECK(r1 == Approx(expect(0.01)));
    CHECK(r2 == Approx(expect(0.02)));
    CHECK(ad::tape_size() == main_tape + 1);
    olmax::sum(pending).backward();
    CHECK(w_main.grad()(0) == Approx(std::exp(1.0)));

    SECTION("a graph from another thread is not live here") {
        Tensor<double> foreign;
        std::thread t([&] { foreign = olmax::exp(olmax::parameter(Tensor<double>({1}, 1.0))); });
        t.join();
        CHECK_THROWS_AS(olmax::sum(foreign), olmax::autodiff_error);
        CHECK_THROWS_AS(foreign.backward(), olmax::autodiff_error);
    }
}

TEST_CASE("the gradient checker catches a missing gradient and a wrong one", "[autodiff][gradcheck]") {
    olmax::Generator rng(34);
    const std::vector<Tensor<double>> in{olmax::randn<double>({4}, rng)};
    auto forgets = [](const std::vector<Tensor<double>>& v) {
        return ad::custom_op("forgets", olmax::square(v[0].detach()), {v[0]}, [](const Tensor<double>&, GradientSink<double>&) {});
    };
    auto wrong = [](const std::vector<Tensor<double>>& v) {
        return ad::custom_op("wrong", olmax::square(v[0].detach()), {v[0]},
                             [x = v[0].detach()](const Tensor<double>& dy, GradientSink<double>& g) { g.add(0, x * dy); });
    };
    CHECK_FALSE(olmax::testing::check_gradients(forgets, in));
    const auto r = olmax::testing::check_gradients(wrong, in);
    CHECK_FALSE(r);
    CHECK(r.report.find("input 0") != std::string::npos);
}

TEST_CASE("backward frees the activations the tape kept alive", "[autodiff][memory]") {
    auto w = olmax::parameter(Tensor<double>({256}, 0.5));
    const auto before = olmax::memory::stats().current_bytes;
    {
        auto h = olmax::tanh(olmax::exp(w) * w);  // exp(w) held by the tape (exp's and mul's backward read it), h by both
        auto loss = olmax::sum(h);
        CHECK(olmax::memory::stats().current_bytes > before + 2 * 256 * sizeof(double));
        loss.backward();
    }
    // Only w's gradient remains.
    CHECK(olmax::memory::stats().current_bytes == before + 256 * sizeof(double));
    w.zero_grad();
    CHECK(olmax::memory::stats().current_bytes == before);
}

TEST_CASE("an activation no backward reads is freed when its last handle goes", "[autodiff][memory]") {
    // h = x w feeds only an add and a slice, whose backward passes read no values: once the code
    // drops h, the tape keeps its node (to pass h's gradient on) but not its buffer.
    olmax::Generator rng(4);
    const auto x = olmax::randn<double>({64, 32}, rng);
    auto w = olmax::parameter(olmax::randn<double>({32, 32}, rng));
    const std::size_t h_bytes = 64 * 32 * sizeof(double);
    Tensor<double> y;
    std::size_t with_h = 0;
    {
        auto h = olmax::matmul(x, w);
        y = olmax::slice(h + h, 1, 0, 8);
        with_h = olmax::memory::stats().current_bytes;
    }
    CHECK(olmax::memory::stats().current_bytes == with_h - h_bytes);
    // (h + h)'s buffer went with its handle too: the slice made a copy. The gradient still flows.
    olmax::sum(y).backward();
    const auto expected = olmax::matmul(olmax::transpose(x), olmax::concat(std::vector<Tensor<double>>{Tensor<double>({64, 8}, 2.0),
                                                                                                       Tensor<double>({64, 24})},
                                                                           1));
    for (std::size_t i = 0; i < expected.size(); ++i) CHECK(w.grad().data()[i] == Approx(expected.data()[i]).epsilon(1e-12));
}

TEST_CASE("values a backward reads stay alive without a handle, and only those", "[autodiff][memory]") {
    // tanh's derivative reads its output, not its input; mul's reads both inputs, not its output.
    auto w = olmax::parameter(Tensor<double>({256}, 0.5));
    const std::size_t n_bytes = 256 * sizeof(double);
    Tensor<double> loss;
    std::size_t before = olmax::memory::stats().current_bytes;
    {
        auto a = olmax::scale(w, 2.0);  // read by no backward once tanh consumed it
        auto t = olmax::tanh(a);        // its output is read by tanh's backward and by mul's
        auto m = olmax::mul(t, t);      // its output is read by nothing
        loss = olmax::sum(m);
        before = olmax::memory::stats().current_bytes - 3 * n_bytes;  // a, t and m held by handles here
    }
    CHECK(olmax::memory::stats().current_bytes == before + n_bytes);  // t alone
    loss.backward();
    // d/dw sum(tanh(2w)^2) = 4 tanh(2w) (1 - tanh(2w)^2)
    const double t = std::tanh(1.0);
    CHECK(w.grad()(0) == Approx(4 * t * (1 - t * t)).epsilon(1e-12));
}

TEST_CASE("GradientSink::add copies an lvalue gradient and may adopt a temporary one", "[autodiff][custom]") {
    auto x = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto y = ad::custom_op("reuses_buffer", x.clone(), {x}, [](const Tensor<double>& dy, GradientSink<double>& g) {
        Tensor<double> scratch = olmax::scale(dy, 2.0);
        g.add(0, scratch);   // copied: the closure may keep using its buffer
        scratch.fill(100);
        g.add(0, olmax::scale(dy, 3.0));  // a temporary; added on top
        Tensor<double> last = olmax::scale(dy, 4.0);
        auto alias = last;   // a second handle: the buffer must not be adopted
        g.add(0, std::move(last));
        alias.fill(-1);
    });
    y.backward(Tensor<double>::from({2}, {1, 10}));
    CHECK(x.grad()(0) == 9);
    CHECK(x.grad()(1) == 90);

    auto z = olmax::parameter(Tensor<double>::from({2}, {1, 2}));
    auto w = ad::custom_op("adopts", z.clone(), {z}, [](const Tensor<double>& dy, GradientSink<double>& g) {
        g.add(0, olmax::scale(dy, 5.0));  // first arrival, sole owner: adopted without a copy
    });
    const auto seed = Tensor<double>::from({2}, {1, 1});
    const auto allocations = olmax::memory::stats().allocations;
    w.backward(seed);
    CHECK(z.grad()(1) == 5);
    // The seed's gradient buffer (1 allocation) and scale's result (1); no third for a copy.
    CHECK(olmax::memory::stats().allocations - allocations == 2);
}
