// Backend conformance suite: ONE list of op tests, run on every target (a device and the kernels
// that serve it); each op's forward value and input gradients are compared with the cpu_serial
// reference on the same inputs, and must come back on the target's device.
//
// To add an op: append one `OpCase` to `op_cases<T>()` below: a name, the input shapes, the input
// domain, a tolerance factor and a lambda calling the op. Every target in `targets()` (and every
// element type) then runs it, with default threading on large shapes (above cpu_openmp's parallel
// threshold) and with threading forced on small, odd shapes (threshold 1 and an odd thread count,
// so partitions are uneven and pieces tiny). To conform a new backend, add it as a target: a
// static backend through `kernels<B>()`, run-time kernels through `register_device`.
#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

using olmax::Shape;
using olmax::Tensor;
using olmax::backend::cpu_openmp;
using olmax::backend::cpu_serial;

namespace {

enum class Domain { normal, positive, away_from_zero };

template <class T>
struct OpCase {
    std::string name;
    std::vector<Shape> large;  ///< shapes whose work crosses cpu_openmp's default parallel threshold
    std::vector<Shape> small;  ///< small, odd shapes (run with threading forced)
    Domain domain = Domain::normal;
    double tolerance = 1;      ///< multiplies the element type's base tolerance (reductions, GEMM: more)
    std::function<Tensor<T>(const std::vector<Tensor<T>>&)> run;
};

// ---- THE LIST: add new ops here ----------------------------------------------------------------
template <class T>
std::vector<OpCase<T>> op_cases() {
    using V = const std::vector<Tensor<T>>&;
    const Shape big{96, 400}, row{400}, col{96, 1}, odd{7, 13}, odd_row{13}, odd_col{7, 1};
    auto unary = [&](std::string name, Domain d, std::function<Tensor<T>(const Tensor<T>&)> f) {
        return OpCase<T>{std::move(name), {big}, {odd}, d, 1, [f](V x) { return f(x[0]); }};
    };
    return {
        // element-wise binary, same shape and broadcast both ways
        {"add", {big, big}, {odd, odd}, Domain::normal, 1, [](V x) { return olmax::add(x[0], x[1]); }},
        {"add row bcast", {big, row}, {odd, odd_row}, Domain::normal, 4, [](V x) { return olmax::add(x[0], x[1]); }},
        {"add col bcast", {col, big}, {odd_col, odd}, Domain::normal, 4, [](V x) { return olmax::add(x[0], x[1]); }},
        {"add rank-0", {Shape{}, big}, {Shape{}, odd}, Domain::normal, 64, [](V x) { return olmax::add(x[0], x[1]); }},
        {"sub", {big, row}, {odd, odd_row}, Domain::normal, 4, [](V x) { return olmax::sub(x[0], x[1]); }},
        {"mul", {big, big}, {odd, odd}, Domain::normal, 1, [](V x) { return olmax::mul(x[0], x[1]); }},
        {"mul outer", {Shape{96, 1}, Shape{1, 400}}, {odd_col, Shape{1, 13}}, Domain::normal, 4, [](V x) { return olmax::mul(x[0], x[1]); }},
        {"div", {big, col}, {odd, odd_col}, Domain::positive, 4, [](V x) { return olmax::div(x[0], x[1]); }},
        {"maximum", {big, row}, {odd, odd_row}, Domain::normal, 1, [](V x) { return olmax::maximum(x[0], x[1]); }},
        {"minimum", {big, row}, {odd, odd_row}, Domain::normal, 1, [](V x) { return olmax::minimum(x[0], x[1]); }},
        // scalar and unary
        {"add_scalar", {big}, {odd}, Domain::normal, 1, [](V x) { return olmax::add_scalar(x[0], T(0.5)); }},
        {"scale", {big}, {odd}, Domain::normal, 1, [](V x) { return olmax::scale(x[0], T(-1.5)); }},
        {"neg", {big}, {odd}, Domain::normal, 1, [](V x) { return olmax::neg(x[0]); }},
        unary("exp", Domain::normal, [](const Tensor<T>& x) { return olmax::exp(x); }),
        unary("log", Domain::positive, [](const Tensor<T>& x) { return olmax::log(x); }),
        unary("sqrt", Domain::positive, [](const Tensor<T>& x) { return olmax::sqrt(x); }),
        unary("rsqrt", Domain::positive, [](const Tensor<T>& x) { return olmax::rsqrt(x); }),
        unary("square", Domain::normal, [](const Tensor<T>& x) { return olmax::square(x); }),
        unary("abs", Domain::away_from_zero, [](const Tensor<T>& x) { return olmax::abs(x); }),
        unary("tanh", Domain::normal, [](const Tensor<T>& x) { return olmax::tanh(x); }),
        unary("sigmoid", Domain::normal, [](const Tensor<T>& x) { return olmax::sigmoid(x); }),
        unary("hard_sigmoid", Domain::normal, [](const Tensor<T>& x) { return olmax::hard_sigmoid(x); }),
        unary("relu", Domain::away_from_zero, [](const Tensor<T>& x) { return olmax::relu(x); }),
        unary("leaky_relu", Domain::away_from_zero, [](const Tensor<T>& x) { return olmax::leaky_relu(x, T(0.1)); }),
        unary("softplus", Domain::normal, [](const Tensor<T>& x) { return olmax::softplus(x); }),
        unary("mish", Domain::normal, [](const Tensor<T>& x) { return olmax::mish(x); }),
        unary("gelu", Domain::normal, [](const Tensor<T>& x) { return olmax::gelu(x); }),
        unary("clamp", Domain::away_from_zero, [](const Tensor<T>& x) { return olmax::clamp(x, T(0), std::numeric_limits<T>::infinity()); }),
        unary("elephant", Domain::away_from_zero, [](const Tensor<T>& x) { return olmax::elephant(x, T(1.5), T(3)); }),
        // reductions
        {"sum all", {big}, {odd}, Domain::normal, 64, [](V x) { return olmax::sum(x[0]); }},
        {"sum 1-D", {Shape{100000}}, {Shape{29}}, Domain::normal, 64, [](V x) { return olmax::sum(x[0]); }},
        {"sum axis 0", {big}, {odd}, Domain::normal, 16, [](V x) { return olmax::sum(x[0], {0}); }},
        {"sum axis -1 keepdims", {big}, {odd}, Domain::normal, 16, [](V x) { return olmax::sum(x[0], {-1}, true); }},
        // tall: more rows than threads need, so the row-block split of sum_middle_axis runs
        {"sum axis 0 tall", {Shape{1024, 70}}, {Shape{200, 5}}, Domain::normal, 16, [](V x) { return olmax::sum(x[0], {0}); }},
        {"add bias tall", {Shape{1024, 70}, Shape{70}}, {Shape{200, 5}, Shape{5}}, Domain::normal, 16,
         [](V x) { return olmax::add(x[0], x[1]); }},
        {"sum axes 0,2 of 3-D", {Shape{12, 40, 80}}, {Shape{3, 5, 7}}, Domain::normal, 16,
         [](V x) { return olmax::sum(x[0], {0, 2}); }},
        {"mean axes 1,2 of 3-D", {Shape{12, 40, 80}}, {Shape{3, 5, 7}}, Domain::normal, 16,
         [](V x) { return olmax::mean(x[0], {1, 2}, true); }},
        {"mean all", {big}, {odd}, Domain::normal, 16, [](V x) { return olmax::mean(x[0]); }},
        {"max axis -1", {big}, {odd}, Domain::normal, 1, [](V x) { return olmax::max(x[0], -1); }},
        {"max axis 0", {big}, {odd}, Domain::normal, 1, [](V x) { return olmax::max(x[0], 0, true); }},
        // matrix products
        {"matmul 2-D", {Shape{64, 96}, Shape{96, 80}}, {Shape{5, 7}, Shape{7, 3}}, Domain::normal, 64,
         [](V x) { return olmax::matmul(x[0], x[1]); }},
        {"matmul N-D x 2-D", {Shape{4, 16, 96}, Shape{96, 80}}, {Shape{3, 5, 7}, Shape{7, 3}}, Domain::normal, 64,
         [](V x) { return olmax::matmul(x[0], x[1]); }},
        {"contract_axis (middle axis)", {Shape{32, 16, 64}, Shape{16, 16}}, {Shape{3, 4, 5}, Shape{4, 3}}, Domain::normal, 64,
         [](V x) { return olmax::contract_axis(x[0], x[1], 1); }},
        {"matmul batched", {Shape{6, 32, 48}, Shape{6, 48, 40}}, {Shape{3, 5, 7}, Shape{3, 7, 3}}, Domain::normal, 64,
         [](V x) { return olmax::matmul(x[0], x[1]); }},
        {"matmul batched x1", {Shape{1, 64, 96}, Shape{1, 96, 80}}, {Shape{1, 5, 7}, Shape{1, 7, 3}}, Domain::normal, 64,
         [](V x) { return olmax::matmul(x[0], x[1]); }},
        // a composite: broadcasting + reduction + GEMM in one graph
        {"composite", {Shape{64, 96}, Shape{96, 80}, Shape{80}}, {Shape{5, 7}, Shape{7, 3}, Shape{3}}, Domain::normal, 64,
         [](V x) { return olmax::mean(olmax::tanh(olmax::add(olmax::matmul(x[0], x[1]), x[2])), {0}); }},
        // row gather / scatter-add and the grouped GEMM of the sparse MoE (indices made on the inputs' device)
        {"gather_rows", {Shape{300, 128}}, {Shape{7, 13}}, Domain::normal, 1,
         [](V x) {
             olmax::device_scope on(x[0].device());
             const std::size_t n = x[0].extent(0);
             std::vector<std::int32_t> rows;
             for (std::size_t m = 0; m < n + n / 2; ++m) rows.push_back(std::int32_t((m * 7 + 3) % n));  // repeats
             return olmax::gather_rows(x[0], Tensor<std::int32_t>::from({rows.size()}, rows));
         }},
        {"scatter_rows", {Shape{300, 128}}, {Shape{7, 13}}, Domain::normal, 4,
         [](V x) {
             olmax::device_scope on(x[0].device());
             const std::size_t m = x[0].extent(0), n = m / 2 + 1;
             std::vector<std::int32_t> rows;
             for (std::size_t i = 0; i < m; ++i) rows.push_back(std::int32_t((i * 5) % n));
             return olmax::scatter_rows(x[0], Tensor<std::int32_t>::from({m}, rows), n + 1);
         }},
        {"grouped_matmul", {Shape{200, 96}, Shape{4, 96, 80}}, {Shape{9, 7}, Shape{3, 7, 3}}, Domain::normal, 64,
         [](V x) {
             const std::size_t m = x[0].extent(0), g = x[1].extent(0);
             std::vector<std::size_t> offsets{0};
             for (std::size_t i = 1; i < g; ++i) offsets.push_back(i == 1 ? 0 : m * i / g);  // group 0 empty
             offsets.push_back(m);
             return olmax::grouped_matmul(x[0], x[1], offsets);
         }},
        // Mamba's selective scan: u, delta > 0, A = -a (a > 0: a decaying state), B, C
        {"selective_scan", {Shape{4, 128, 64}, Shape{4, 128, 64}, Shape{64, 16}, Shape{4, 128, 16}, Shape{4, 128, 16}},
         {Shape{1, 7, 5}, Shape{1, 7, 5}, Shape{5, 3}, Shape{1, 7, 3}, Shape{1, 7, 3}}, Domain::positive, 64,
         [](V x) { return olmax::scan::selective_scan(x[0], x[1], olmax::neg(x[2]), x[3], x[4]).y; }},
    };
}
// -------------------------------------------------------------------------------------------------

template <class T>
Tensor<T> sample(Domain d, const Shape& shape, olmax::Generator& rng) {
    switch (d) {
        case Domain::positive: return olmax_test::uniform<T>(shape, rng, 0.5, 2.0);
        case Domain::away_from_zero: return olmax_test::randn_away_from<T>(shape, rng, {0.0}, 0.05);
        case Domain::normal: break;
    }
    return olmax::randn<T>(shape, rng);
}

template <class T>
struct Outcome {
    Tensor<T> value;
    std::vector<Tensor<T>> grads;
};

/// Where a case runs: inputs moved to `device`, with `host` as the host's kernels meanwhile;
/// `bf16`: under the bf16 precision policy (Bf16MatmulKernels wrapping `host`: float GEMMs on
/// bfloat16-rounded operands), and compared with cpu_serial under the same policy.
struct Target {
    std::string name;
    olmax::Device device;
    const olmax::backend::Kernels* host;
    bool bf16 = false;
};

const olmax::backend::Kernels& refusing() {
    static const olmax_test::refusing_kernels k;
    return k;
}

std::vector<Target> targets() {
    static const olmax::Device stub = olmax::backend::register_device(
        "stub", std::shared_ptr<const olmax::backend::Kernels>(&olmax::backend::kernels<olmax_test::stub_backend>(), [](const auto*) {}));
    return {{"host, cpu_serial kernels", olmax::Device::host(), &olmax::backend::kernels<cpu_serial>()},
            {"host, cpu_openmp kernels", olmax::Device::host(), &olmax::backend::kernels<cpu_openmp>()},
            {"host, cpu_openmp kernels, bf16 policy", olmax::Device::host(), &olmax::backend::kernels<cpu_openmp>(), true},
            {"registered device on the stub backend", stub, &olmax::backend::kernels<cpu_serial>()},
            // The host refuses all work here: every primitive of forward and backward must reach the device.
            {"registered counting device, host refusing", olmax_test::counting().device, &refusing()}};
}

/// Forward, then backward with `seed` as the output gradient; the inputs' gradients. Results must
/// be on the target's device.
template <class T>
Outcome<T> run_case(const OpCase<T>& c, const std::vector<Tensor<T>>& inputs, olmax::Generator seed_rng, const Target& target) {
    std::optional<olmax::backend::Bf16MatmulKernels> policy;
    if (target.bf16) policy.emplace(*target.host);
    olmax::backend::host_kernels_scope host(policy ? *policy : *target.host);
    olmax::autodiff::tape_scope scope;
    std::vector<Tensor<T>> x;
    for (const auto& in : inputs) x.push_back(olmax::parameter(in.to(target.device)));
    Outcome<T> out;
    out.value = c.run(x);
    CHECK(out.value.device() == target.device);
    out.value.backward(olmax::randn<T>(out.value.shape(), seed_rng).to(target.device));
    for (const auto& xi : x) {
        out.grads.push_back(xi.grad());
        if (out.grads.back().defined()) CHECK(out.grads.back().device() == target.device);
    }
    return out;
}

/// |a - b| <= tol * (1 + max |reference|), elementwise with the reference's scale.
template <class T>
void check_close(const Tensor<T>& got, const Tensor<T>& reference, double tol, const std::string& what) {
    INFO(what);
    REQUIRE(got.defined());
    REQUIRE(reference.defined());
    REQUIRE(got.shape() == reference.shape());
    double scale = 1;
    for (T v : reference) scale = std::max(scale, std::abs(double(v)));
    const double diff = olmax_test::max_abs_diff(got, reference);
    INFO("max |difference| " << diff << ", allowed " << tol * scale);
    CHECK(diff <= tol * scale);
}

template <class T>
void run_conformance(const Target& target, bool small) {
    const auto cases = op_cases<T>();
    const Target reference{"reference", olmax::Device::host(), &olmax::backend::kernels<cpu_serial>(), target.bf16};
    const double base = std::is_same_v<T, float> ? 2e-6 : 1e-14;
    olmax::Generator rng(small ? 41 : 42);
    for (std::size_t i = 0; i < cases.size(); ++i) {
        const auto& c = cases[i];
        INFO("target " << target.name << ", op " << c.name << (small ? " (small, forced threading)" : " (large)"));
        std::vector<Tensor<T>> inputs;
        for (const Shape& s : small ? c.small : c.large) inputs.push_back(sample<T>(c.domain, s, rng));
        const olmax::Generator seed_rng(1000 + i);
        const auto want = run_case(c, inputs, seed_rng, reference);
        const auto got = [&] {
            if (!small) return run_case(c, inputs, seed_rng, target);
            olmax_test::ForceThreading force;
            return run_case(c, inputs, seed_rng, target);
        }();
        const double tol = base * c.tolerance;
        check_close(got.value, want.value, tol, "forward");
        REQUIRE(got.grads.size() == want.grads.size());
        for (std::size_t k = 0; k < got.grads.size(); ++k) check_close(got.grads[k], want.grads[k], tol, "gradient of input " + std::to_string(k));
    }
}

}  // namespace

TEST_CASE("conformance: every op matches cpu_serial on every target, forward and backward, and stays on its device",
          "[conformance][backend]") {
    for (const Target& target : targets()) {
        SECTION(target.name) {
            SECTION("float, large shapes, default threshold") { run_conformance<float>(target, false); }
            SECTION("double, large shapes, default threshold") { run_conformance<double>(target, false); }
            SECTION("float, small odd shapes, threading forced") { run_conformance<float>(target, true); }
            SECTION("double, small odd shapes, threading forced") { run_conformance<double>(target, true); }
        }
    }
}

TEST_CASE("conformance list crosses cpu_openmp's default parallel threshold", "[conformance][backend]") {
    // The large shapes must be large enough that cpu_openmp really threads them: the work of an
    // element-wise op or reduction is its largest operand, of a GEMM m * k * n.
    olmax::autodiff::no_grad guard;
    olmax::Generator rng(44);
    for (const auto& c : op_cases<float>()) {
        INFO(c.name);
        std::vector<Tensor<float>> x;
        for (const auto& s : c.large) x.push_back(sample<float>(c.domain, s, rng));
        std::size_t work = c.run(x).size();
        for (const auto& t : x) work = std::max(work, t.size());
        if (x.size() >= 2 && x[0].rank() >= 2 && x[1].rank() >= 2 && x[0].shape().back() == x[1].shape()[x[1].rank() - 2])
            work = std::max(work, x[0].size() * x[1].shape().back());  // a matrix product
        CHECK(work >= cpu_openmp::parallel_threshold());
    }
}

TEST_CASE("static backends model the concept; the host's default kernels are cpu_openmp", "[conformance][backend]") {
    STATIC_REQUIRE(olmax::backend::Backend<olmax_test::stub_backend>);
    STATIC_REQUIRE(olmax::backend::Backend<cpu_serial>);
    STATIC_REQUIRE(std::is_same_v<olmax::backend::default_backend, cpu_openmp>);
    CHECK(olmax::backend::host_kernels().name() == "cpu_openmp");
    {
        olmax::backend::host_kernels_scope serial(olmax::backend::kernels<cpu_serial>());
        CHECK(olmax::backend::host_kernels().name() == "cpu_serial");
        CHECK(olmax::backend::current().name() == "cpu_serial");
    }
    CHECK(olmax::backend::current().name() == "cpu_openmp");
}

TEST_CASE("backend primitives agree: parallel_for covers [0, n) once, sum, map, gemm", "[conformance][backend]") {
    olmax_test::ForceThreading force;
    for (std::size_t n : {0u, 1u, 2u, 3u, 5u, 1000u, 100003u}) {
        INFO("n = " << n);
        std::vector<int> hits(n, 0);
        cpu_openmp::parallel_for(n, 1, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) ++hits[i];
        });
        CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
        olmax::Generator rng(n);
        const auto x = olmax::randn<float>({n}, rng);
        const double s_serial = cpu_serial::sum(x.data(), n), s_omp = cpu_openmp::sum(x.data(), n);
        CHECK(s_omp == Approx(s_serial).margin(1e-9));
        CHECK(cpu_openmp::sum(x.data(), n) == s_omp);  // deterministic run to run
        Tensor<float> y1({n}), y2({n});
        cpu_serial::map(n, y1.data(), [](float v) { return 2 * v + 1; }, x.data());
        cpu_openmp::map(n, y2.data(), [](float v) { return 2 * v + 1; }, x.data());
        CHECK(olmax_test::max_abs_diff(y1, y2) == 0);
    }
    // Transposed GEMM variants with leading dimensions larger than the matrix.
    olmax::Generator rng(43);
    const auto a = olmax::randn<double>({9, 12}, rng), b = olmax::randn<double>({12, 10}, rng);
    for (bool ta : {false, true})
        for (bool tb : {false, true}) {
            INFO("ta " << ta << " tb " << tb);
            // op(A) is 5 x 4 and op(B) is 4 x 6, cut out of the bigger buffers with their leading dims.
            Tensor<double> c1({5, 8}, 0.5), c2({5, 8}, 0.5);
            cpu_serial::gemm(ta, tb, 5, 6, 4, 2.0, a.data(), 12, b.data(), 10, 0.5, c1.data(), 8);
            cpu_openmp::gemm(ta, tb, 5, 6, 4, 2.0, a.data(), 12, b.data(), 10, 0.5, c2.data(), 8);
            CHECK(olmax_test::max_abs_diff(c1, c2) < 1e-13);
            double expect = 0;  // element (1, 2) by hand
            for (std::size_t p = 0; p < 4; ++p) {
                const double av = ta ? a(p, 1) : a(1, p);
                const double bv = tb ? b(2, p) : b(p, 2);
                expect += av * bv;
            }
            CHECK(c1(1, 2) == Approx(2 * expect + 0.25));
            CHECK(c1(1, 7) == 0.5);  // outside the 6 columns: untouched
        }
}

TEST_CASE("cpu_serial GEMM equals the naive product: vector results, tiny and blocked shapes, every transpose, padded rows",
          "[conformance][backend]") {
    // The GEMM takes three routes (a vector result, Eigen's blocked routine, k = 0 or alpha = 0);
    // each is compared, in float and double, with a triple loop accumulated in double.
    auto check_type = [&]<class T>(T tolerance) {
        olmax::Generator rng(47);
        struct Dims {
            std::size_t m, n, k;
        };
        for (const Dims s : {Dims{1, 1, 1}, Dims{1, 37, 13}, Dims{29, 1, 13}, Dims{1, 9, 3}, Dims{6, 1, 70}, Dims{3, 5, 2}, Dims{4, 4, 4},
                             Dims{17, 33, 9}, Dims{70, 90, 80}, Dims{5, 6, 0}})
            for (bool ta : {false, true})
                for (bool tb : {false, true})
                    for (const auto& [alpha, beta] : std::vector<std::pair<T, T>>{{1, 0}, {T(-0.5), 2}, {0, T(0.5)}, {2, 1}}) {
                        INFO("m " << s.m << " n " << s.n << " k " << s.k << " ta " << ta << " tb " << tb << " alpha " << alpha << " beta " << beta);
                        // Leading dimensions 3 wider than the stored rows, C's padding must stay.
                        const std::size_t a_rows = ta ? s.k : s.m, a_cols = ta ? s.m : s.k, lda = a_cols + 3;
                        const std::size_t b_rows = tb ? s.n : s.k, b_cols = tb ? s.k : s.n, ldb = b_cols + 3, ldc = s.n + 3;
                        const auto a = olmax::randn<T>({a_rows * lda + 1}, rng), b = olmax::randn<T>({b_rows * ldb + 1}, rng);
                        auto c = olmax::randn<T>({s.m * ldc + 1}, rng);
                        if (beta == T(0)) c.data()[0] = std::numeric_limits<T>::quiet_NaN();  // beta 0 overwrites, even NaN
                        std::vector<double> expect(s.m * ldc);
                        for (std::size_t i = 0; i < s.m; ++i)
                            for (std::size_t j = 0; j < ldc; ++j) {
                                const double before = c.data()[i * ldc + j];
                                if (j >= s.n) {
                                    expect[i * ldc + j] = before;
                                    continue;
                                }
                                double dot = 0;
                                for (std::size_t p = 0; p < s.k; ++p)
                                    dot += double(ta ? a.data()[p * lda + i] : a.data()[i * lda + p]) *
                                           double(tb ? b.data()[j * ldb + p] : b.data()[p * ldb + j]);
                                expect[i * ldc + j] = double(alpha) * dot + (beta == T(0) ? 0.0 : double(beta) * before);
                            }
                        cpu_serial::gemm(ta, tb, s.m, s.n, s.k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
                        double worst = 0;  // a NaN anywhere makes it NaN, and the check fail
                        for (std::size_t i = 0; i < s.m * ldc; ++i) worst = olmax_test::worse(worst, std::abs(double(c.data()[i]) - expect[i]));
                        CHECK(worst < double(tolerance));
                    }
    };
    check_type.operator()<float>(1e-4f);
    check_type.operator()<double>(1e-12);
}

TEST_CASE("omp_thread_cap caps OpenMP to one thread only for its scope; a cpu_serial GEMM leaves the setting alone",
          "[conformance][backend]") {
#if defined(_OPENMP)
    struct Restore {
        int threads = omp_get_max_threads();
        ~Restore() { omp_set_num_threads(threads); }
    } restore;
    omp_set_num_threads(3);
    {
        olmax::backend::detail::omp_thread_cap cap(1);
        CHECK(Eigen::nbThreads() == 1);  // what an OpenMP-threaded library called inside the scope uses
    }
    CHECK(omp_get_max_threads() == 3);
    olmax::Generator rng(45);
    const auto a = olmax::randn<double>({70, 80}, rng), b = olmax::randn<double>({80, 90}, rng);
    Tensor<double> c({70, 90});
    cpu_serial::gemm(false, false, 70, 90, 80, 1.0, a.data(), 80, b.data(), 90, 0.0, c.data(), 90);
    CHECK(omp_get_max_threads() == 3);  // restored after the call
    CHECK(Eigen::nbThreads() == 3);
    // Inside an OpenMP region the cap is per thread: the other threads keep their setting.
    int others_ok = 1;
#pragma omp parallel num_threads(2) reduction(min : others_ok)
    {
        if (omp_get_thread_num() == 0) {
            olmax::backend::detail::omp_thread_cap cap(1);
            others_ok = omp_get_max_threads() == 1;
        }
    }
    CHECK(others_ok == 1);
#else
    SUCCEED("built without OpenMP");
#endif
}

TEST_CASE("conformance: the bf16-policy target really computes its GEMMs on rounded operands", "[conformance][backend][bf16]") {
    // Its reference runs under the same policy, so the list alone would pass if the policy did
    // nothing; here a product under the target's kernels is the fp32 product of the rounded
    // operands, and differs from the plain fp32 one.
    olmax::Generator rng(45);
    const Tensor<float> a = olmax::randn<float>({64, 96}, rng), b = olmax::randn<float>({96, 80}, rng);
    const Target target = targets()[2];
    REQUIRE(target.bf16);
    const Tensor<float> plain = olmax::matmul(a, b);
    const Tensor<float> rounded_product = olmax::matmul(olmax::cast<float>(olmax::cast<olmax::bfloat16>(a)), olmax::cast<float>(olmax::cast<olmax::bfloat16>(b)));
    olmax::backend::Bf16MatmulKernels policy(*target.host);
    olmax::backend::host_kernels_scope host(policy);
    const Tensor<float> got = olmax::matmul(a, b);
    CHECK(olmax_test::max_abs_diff(got, rounded_product) <= 1e-4);
    CHECK(olmax_test::max_abs_diff(got, plain) > 1e-3);
}

TEST_CASE("conformance: every target's bf16 product (Kernels::gemm_bf16) is the exact product of its bf16 operands, in fp32",
          "[conformance][backend][bf16]") {
    // The device seam for bf16 operands (a scan's chunks in bf16 storage, backend::gemm_bf16): with
    // every transpose and leading dimensions wider than the matrices, against the fp64 product of the
    // same bf16 values within fp32 accumulation, |C - exact| <= (k + 1) 2^-24 sum_p |a_ip b_pj|.
    olmax::backend::set_bf16_notice_sink([](std::string_view) {});
    olmax::Generator rng(46);
    const std::size_t m = 7, n = 9, k = 33, ld = 40;
    const auto a = olmax::cast<olmax::bfloat16>(olmax::randn<float>({k, ld}, rng));  // room for op(A) [m, k] either way
    const auto b = olmax::cast<olmax::bfloat16>(olmax::randn<float>({k, ld}, rng));
    for (const Target& target : targets()) {
        if (target.host == &refusing()) continue;  // refuses every primitive by design
        std::optional<olmax::backend::Bf16MatmulKernels> policy;
        if (target.bf16) policy.emplace(*target.host);
        const olmax::backend::Kernels& kernels = policy ? static_cast<const olmax::backend::Kernels&>(*policy) : *target.host;
        for (bool ta : {false, true})
            for (bool tb : {false, true}) {
                INFO(target.name << ": ta " << ta << " tb " << tb);
                Tensor<float> c({m, ld}, 0.5f);
                kernels.gemm_bf16(ta, tb, m, n, k, 2.0f, a.data(), ld, b.data(), ld, 0.5f, c.data(), ld);
                for (std::size_t i = 0; i < m; ++i)
                    for (std::size_t j = 0; j < ld; ++j) {
                        if (j >= n) {
                            CHECK(c(i, j) == 0.5f);  // outside the n columns: untouched
                            continue;
                        }
                        double exact = 0, magnitude = 0;
                        for (std::size_t p = 0; p < k; ++p) {
                            const double av = float(ta ? a(p, i) : a(i, p)), bv = float(tb ? b(j, p) : b(p, j));
                            exact += av * bv;
                            magnitude += std::abs(av * bv);
                        }
                        CHECK(std::abs(double(c(i, j)) - (2 * exact + 0.25)) <= 2 * (double(k) + 1) * 0x1p-24 * magnitude + 1e-6);
                    }
            }
    }
    olmax::backend::set_bf16_notice_sink({});
}
