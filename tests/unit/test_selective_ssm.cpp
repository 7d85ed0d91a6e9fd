// scan::selective_scan and nn::SelectiveSSM (Mamba): gradients in double, the op against a
// materialised reference, causality, packed-sequence resets, chunk independence, bad shapes.
#include "test_helpers.hpp"

#include "olmax/nn/selective_ssm.hpp"
#include "olmax/scan/selective_scan.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sc = olmax::scan;
namespace nn = olmax::nn;
using olmax::Tensor;

namespace {

/// The op's inputs at sizes [batch, T, E] with state N: delta > 0, A < 0 as in Mamba.
struct ScanInputs {
    Tensor<double> u, delta, A, B, C, D, h0, resets;
    std::vector<Tensor<double>> differentiable() const { return {u, delta, A, B, C, D, h0}; }
};

ScanInputs make_inputs(std::size_t batch, std::size_t time, std::size_t channels, std::size_t state, std::uint64_t seed) {
    olmax::Generator rng(seed);
    ScanInputs in;
    in.u = olmax::randn<double>({batch, time, channels}, rng);
    in.delta = olmax_test::uniform({batch, time, channels}, rng, 0.05, 0.8);
    in.A = olmax_test::uniform({channels, state}, rng, -2.0, -0.2);
    in.B = olmax::randn<double>({batch, time, state}, rng);
    in.C = olmax::randn<double>({batch, time, state}, rng);
    in.D = olmax::randn<double>({channels}, rng);
    in.h0 = olmax::randn<double>({batch, channels, state}, rng);
    in.resets = Tensor<double>({batch, time});
    return in;
}

/// y and h_last of the op, flattened into one vector (for the gradient checker).
Tensor<double> flat_outputs(const sc::SelectiveScanResult<double>& r) {
    return olmax::concat({olmax::reshape(r.y, {r.y.size()}), olmax::reshape(r.h_last, {r.h_last.size()})}, 0);
}

/// The materialised reference: every state h[b, t, e, n] and gate stored, then the adjoint
/// recurrence written out (the formulas at the top of olmax/scan/selective_scan.hpp).
struct SsmReference {
    std::vector<double> y, h_last, du, ddelta, dA, dB, dC, dD, dh0;
};

SsmReference reference(const ScanInputs& in, bool use_h0, bool use_resets, const Tensor<double>& dy, const Tensor<double>& dh_last) {
    const std::size_t nb = in.u.extent(0), nt = in.u.extent(1), ne = in.u.extent(2), ns = in.A.extent(1);
    auto at = [&](std::size_t b, std::size_t t, std::size_t e, std::size_t n) { return ((b * nt + t) * ne + e) * ns + n; };
    std::vector<double> h(nb * nt * ne * ns), abar(h.size());
    SsmReference r;
    r.y.assign(nb * nt * ne, 0);
    r.h_last.assign(nb * ne * ns, 0);
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t t = 0; t < nt; ++t) {
            const bool reset = use_resets && in.resets(b, t) != 0;
            for (std::size_t e = 0; e < ne; ++e) {
                double acc = 0;
                for (std::size_t n = 0; n < ns; ++n) {
                    const double prev = t > 0 ? h[at(b, t - 1, e, n)] : (use_h0 ? in.h0(b, e, n) : 0.0);
                    const double a = reset ? 0.0 : std::exp(in.delta(b, t, e) * in.A(e, n));
                    abar[at(b, t, e, n)] = a;
                    h[at(b, t, e, n)] = (reset ? 0.0 : a * prev) + in.delta(b, t, e) * in.u(b, t, e) * in.B(b, t, n);
                    acc += in.C(b, t, n) * h[at(b, t, e, n)];
                }
                r.y[(b * nt + t) * ne + e] = acc + in.D(e) * in.u(b, t, e);
            }
        }
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t i = 0; i < ne * ns; ++i) r.h_last[b * ne * ns + i] = h[at(b, nt - 1, 0, 0) + i];
    r.du.assign(nb * nt * ne, 0);
    r.ddelta.assign(nb * nt * ne, 0);
    r.dA.assign(ne * ns, 0);
    r.dB.assign(nb * nt * ns, 0);
    r.dC.assign(nb * nt * ns, 0);
    r.dD.assign(ne, 0);
    r.dh0.assign(nb * ne * ns, 0);
    for (std::size_t b = 0; b < nb; ++b) {
        std::vector<double> g(ne * ns);
        for (std::size_t i = 0; i < ne * ns; ++i) g[i] = dh_last.data()[b * ne * ns + i];
        for (std::size_t t = nt; t-- > 0;) {
            for (std::size_t e = 0; e < ne; ++e) {
                const double dyv = dy(b, t, e), dt = in.delta(b, t, e), x = in.u(b, t, e);
                double sum_gb = 0, sum_q = 0;
                for (std::size_t n = 0; n < ns; ++n) {
                    const double gn = g[e * ns + n] + in.C(b, t, n) * dyv;
                    const double prev = t > 0 ? h[at(b, t - 1, e, n)] : (use_h0 ? in.h0(b, e, n) : 0.0);
                    const double q = gn * prev * abar[at(b, t, e, n)];
                    r.dC[(b * nt + t) * ns + n] += dyv * h[at(b, t, e, n)];
                    r.dB[(b * nt + t) * ns + n] += gn * dt * x;
                    sum_gb += gn * in.B(b, t, n);
                    sum_q += q * in.A(e, n);
                    r.dA[e * ns + n] += q * dt;
                    g[e * ns + n] = abar[at(b, t, e, n)] * gn;
                }
                r.du[(b * nt + t) * ne + e] = in.D(e) * dyv + dt * sum_gb;
                r.ddelta[(b * nt + t) * ne + e] = x * sum_gb + sum_q;
                r.dD[e] += dyv * x;
            }
        }
        for (std::size_t i = 0; i < ne * ns; ++i) r.dh0[b * ne * ns + i] = g[i];
    }
    return r;
}

/// max |a - b| / max(max |b|, tiny): the normwise relative error of a tensor against the reference.
double relative_error(const Tensor<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double err = 0, scale = 1e-300;
    for (std::size_t i = 0; i < b.size(); ++i) {
        err = std::max(err, std::abs(a.data()[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return err / scale;
}

/// The op's value and input gradients for output gradients dy, dh_last.
struct SsmRun {
    Tensor<double> y, h_last, du, ddelta, dA, dB, dC, dD, dh0;
};

/// Every output and gradient of two runs equal bit for bit.
void check_identical(const SsmRun& a, const SsmRun& b) {
    CHECK(olmax_test::max_abs_diff(a.y, b.y) == 0);
    CHECK(olmax_test::max_abs_diff(a.h_last, b.h_last) == 0);
    CHECK(olmax_test::max_abs_diff(a.du, b.du) == 0);
    CHECK(olmax_test::max_abs_diff(a.ddelta, b.ddelta) == 0);
    CHECK(olmax_test::max_abs_diff(a.dA, b.dA) == 0);
    CHECK(olmax_test::max_abs_diff(a.dB, b.dB) == 0);
    CHECK(olmax_test::max_abs_diff(a.dC, b.dC) == 0);
    CHECK(olmax_test::max_abs_diff(a.dD, b.dD) == 0);
    CHECK(olmax_test::max_abs_diff(a.dh0, b.dh0) == 0);
}

SsmRun run_op(const ScanInputs& base, bool use_h0, bool use_resets, const Tensor<double>& dy, const Tensor<double>& dh_last,
           std::optional<long> chunk = std::nullopt) {
    std::vector<Tensor<double>> x;
    for (const auto& t : base.differentiable()) x.push_back(olmax::parameter(t.clone()));
    auto r = sc::selective_scan(x[0], x[1], x[2], x[3], x[4], x[5],
                                {.h0 = use_h0 ? x[6] : Tensor<double>(), .resets = use_resets ? base.resets : Tensor<double>(), .chunk = chunk});
    auto loss = olmax::add(olmax::sum(olmax::mul(r.y, dy)), olmax::sum(olmax::mul(r.h_last, dh_last)));
    loss.backward();
    return {r.y.detach(), r.h_last.detach(), x[0].grad(), x[1].grad(), x[2].grad(), x[3].grad(), x[4].grad(), x[5].grad(),
            use_h0 ? x[6].grad() : Tensor<double>()};
}

std::vector<Tensor<double>> ssm_parameters(nn::SelectiveSSM<double>& layer) {
    std::vector<Tensor<double>> out;
    nn::ParameterVisitor<double> visit([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { out.push_back(t.detach().clone()); });
    layer.visit_parameters(visit);
    return out;
}

void bind_parameters(nn::SelectiveSSM<double>& layer, const std::vector<Tensor<double>>& params) {
    std::size_t i = 0;
    nn::ParameterVisitor<double> visit([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { t = params[i++]; });
    layer.visit_parameters(visit);
}

nn::SelectiveSSMConfig small_ssm_config() {
    nn::SelectiveSSMConfig c;
    c.features = 3;
    c.inner = 5;
    c.state = 3;
    c.conv_kernel = 3;
    c.dt_rank = 2;
    c.chunk = 3;
    return c;
}

}  // namespace

TEST_CASE("scan::selective_scan: gradients (double) of every input, with h0, D and resets", "[selective_ssm][grad]") {
    auto in = make_inputs(2, 7, 3, 4, 1);
    in.resets(0, 3) = 1;  // a second document starting mid-row
    in.resets(1, 0) = 1;  // a row starting with a document start: h0 does not reach it
    in.resets(1, 5) = 1;
    for (long chunk : {1L, 3L, 64L}) {
        auto f = [&](const std::vector<Tensor<double>>& x) {
            return flat_outputs(sc::selective_scan(x[0], x[1], x[2], x[3], x[4], x[5], {.h0 = x[6], .resets = in.resets, .chunk = chunk}));
        };
        INFO("chunk " << chunk);
        olmax_test::check_gradients(f, in.differentiable());
    }
}

TEST_CASE("scan::selective_scan: gradients (double) without h0, D or resets", "[selective_ssm][grad]") {
    auto in = make_inputs(2, 6, 4, 3, 2);
    auto f = [&](const std::vector<Tensor<double>>& x) {
        return flat_outputs(sc::selective_scan(x[0], x[1], x[2], x[3], x[4], Tensor<double>(), {.chunk = 4}));
    };
    olmax_test::check_gradients(f, {in.u, in.delta, in.A, in.B, in.C});
}

TEST_CASE("scan::selective_scan: matches the materialised reference, forward and backward, to 1e-12", "[selective_ssm]") {
    // 3 x 40 rows over E = 24, N = 6: four channel blocks, so the partial sums of dB and dC are exercised.
    auto in = make_inputs(3, 40, 24, 6, 3);
    for (std::size_t t : {0u, 11u, 12u, 39u}) in.resets(1, t) = 1;
    in.resets(2, 20) = 1;
    olmax::Generator rng(30);
    const auto dy = olmax::randn<double>(in.u.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    for (bool use_resets : {false, true})
        for (bool use_h0 : {false, true}) {
            INFO("resets " << use_resets << ", h0 " << use_h0);
            const SsmReference ref = reference(in, use_h0, use_resets, dy, dh_last);
            const SsmRun op = run_op(in, use_h0, use_resets, dy, dh_last, 7);
            CHECK(relative_error(op.y, ref.y) < 1e-12);
            CHECK(relative_error(op.h_last, ref.h_last) < 1e-12);
            CHECK(relative_error(op.du, ref.du) < 1e-12);
            CHECK(relative_error(op.ddelta, ref.ddelta) < 1e-12);
            CHECK(relative_error(op.dA, ref.dA) < 1e-12);
            CHECK(relative_error(op.dB, ref.dB) < 1e-12);
            CHECK(relative_error(op.dC, ref.dC) < 1e-12);
            CHECK(relative_error(op.dD, ref.dD) < 1e-12);
            if (use_h0) CHECK(relative_error(op.dh0, ref.dh0) < 1e-12);
        }
}

TEST_CASE("scan::selective_scan: results do not depend on the chunk size", "[selective_ssm]") {
    auto in = make_inputs(2, 23, 8, 4, 4);
    in.resets(0, 9) = 1;
    olmax::Generator rng(40);
    const auto dy = olmax::randn<double>(in.u.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsmRun whole = run_op(in, true, true, dy, dh_last, 23);
    for (long chunk : {1L, 2L, 5L, 22L, 100L}) {
        INFO("chunk " << chunk);
        const SsmRun r = run_op(in, true, true, dy, dh_last, chunk);
        // The recomputed states equal the forward's bit for bit, so everything is identical.
        check_identical(r, whole);
    }
}

TEST_CASE("scan::selective_scan_forward / _backward on caller-owned buffers give the op's results bit for bit", "[selective_ssm]") {
    // The functions a native call runs inside an XLA program (trace/native_calls.hpp); E = 24, N = 6
    // with batch 3: several channel blocks, so the block sums of dB and dC run too.
    auto in = make_inputs(3, 11, 24, 6, 6);
    in.resets(1, 4) = 1;
    olmax::Generator rng(50);
    const auto dy = olmax::randn<double>(in.u.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsmRun op = run_op(in, true, true, dy, dh_last, 3);
    const sc::SelectiveScanSizes sizes{3, 11, 24, 6, 3};
    const sc::SelectiveScanBuffers<double> buffers{in.u.data(), in.delta.data(), in.A.data(),  in.B.data(),
                                                   in.C.data(), in.D.data(),     in.h0.data(), in.resets.data()};
    SsmRun raw{Tensor<double>(op.y.shape()),  Tensor<double>(op.h_last.shape()), Tensor<double>(op.du.shape()),
               Tensor<double>(op.ddelta.shape()), Tensor<double>(op.dA.shape()), Tensor<double>(op.dB.shape()),
               Tensor<double>(op.dC.shape()), Tensor<double>(op.dD.shape()),     Tensor<double>(op.dh0.shape())};
    Tensor<double> checkpoints({3, 4, 24, 6});
    sc::selective_scan_forward(sizes, buffers, raw.y.data(), raw.h_last.data(), checkpoints.data());
    sc::selective_scan_backward(sizes, buffers, dy.data(), dh_last.data(), checkpoints.data(),
                                sc::SelectiveScanGradients<double>{raw.du.data(), raw.ddelta.data(), raw.dA.data(), raw.dB.data(),
                                                                   raw.dC.data(), raw.dD.data(), raw.dh0.data()});
    check_identical(raw, op);
    // A size of 0 is refused with a message, not a division by zero.
    CHECK_THROWS_WITH(sc::selective_scan_forward<double>(sc::SelectiveScanSizes{3, 11, 24, 6, 0}, buffers, raw.y.data(), raw.h_last.data(), nullptr),
                      Catch::Contains("must all be positive"));
}

TEST_CASE("scan::selective_scan: causal, changing step t changes no output before t", "[selective_ssm]") {
    const auto in = make_inputs(2, 16, 6, 4, 5);
    const auto base = sc::selective_scan(in.u, in.delta, in.A, in.B, in.C, in.D, {.h0 = in.h0, .chunk = 4});
    for (std::size_t t : {0u, 5u, 15u}) {
        auto changed = in;
        for (Tensor<double>* x : {&changed.u, &changed.delta}) *x = x->clone();
        changed.B = in.B.clone();
        changed.C = in.C.clone();
        for (std::size_t b = 0; b < 2; ++b) {
            for (std::size_t e = 0; e < 6; ++e) changed.u(b, t, e) += 1.5, changed.delta(b, t, e) += 0.3;
            for (std::size_t n = 0; n < 4; ++n) changed.B(b, t, n) -= 0.7, changed.C(b, t, n) += 0.9;
        }
        const auto r = sc::selective_scan(changed.u, changed.delta, changed.A, changed.B, changed.C, changed.D, {.h0 = in.h0, .chunk = 4});
        for (std::size_t b = 0; b < 2; ++b)
            for (std::size_t s = 0; s < 16; ++s) {
                double diff = 0;
                for (std::size_t e = 0; e < 6; ++e) diff = std::max(diff, std::abs(r.y(b, s, e) - base.y(b, s, e)));
                INFO("changed t " << t << ", output s " << s);
                if (s < t) CHECK(diff == 0);
                else if (s == t) CHECK(diff > 0);
            }
    }
}

TEST_CASE("scan::selective_scan: a packed pair with a reset equals the two sequences run alone", "[selective_ssm]") {
    const std::size_t first = 5, second = 9, total = first + second, ne = 4, ns = 3;
    auto packed = make_inputs(1, total, ne, ns, 6);
    packed.resets(0, first) = 1;
    auto part = [&](const Tensor<double>& t, std::size_t begin, std::size_t end) { return olmax::slice(t, 1, begin, end).detach(); };
    olmax::Generator rng(60);
    const auto dy = olmax::randn<double>(packed.u.shape(), rng);
    const auto zero_state = Tensor<double>({1, ne, ns});

    const SsmRun both = run_op(packed, true, true, dy, zero_state);
    auto alone = [&](std::size_t begin, std::size_t end, bool with_h0) {
        ScanInputs in = packed;
        in.u = part(packed.u, begin, end);
        in.delta = part(packed.delta, begin, end);
        in.B = part(packed.B, begin, end);
        in.C = part(packed.C, begin, end);
        in.resets = Tensor<double>({1, end - begin});
        return run_op(in, with_h0, false, part(dy, begin, end), zero_state);
    };
    const SsmRun one = alone(0, first, true), two = alone(first, total, false);
    auto joined = [&](const Tensor<double>& a, const Tensor<double>& b) { return olmax::concat({a, b}, 1); };
    CHECK(olmax_test::max_abs_diff(both.y, joined(one.y, two.y)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.h_last, two.h_last) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.du, joined(one.du, two.du)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.ddelta, joined(one.ddelta, two.ddelta)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.dB, joined(one.dB, two.dB)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.dC, joined(one.dC, two.dC)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.dA, olmax::add(one.dA, two.dA)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.dD, olmax::add(one.dD, two.dD)) < 1e-13);
    CHECK(olmax_test::max_abs_diff(both.dh0, one.dh0) < 1e-13);  // h0 reaches the first document only
}

TEST_CASE("scan::selective_scan: resets from a packed loader batch separate its documents", "[selective_ssm]") {
    // The loader's rows are "EOD doc EOD doc ...": a document's first input is the EOD byte, so
    // resets = (inputs == EOD) starts the state afresh for every document.
    olmax::data::Documents docs{{'a', 'b', 'c'}, {'x', 'y'}, {'h', 'e', 'l', 'l', 'o'}};
    olmax::data::PackedLoader loader(docs, {.batch_size = 1, .sequence_length = 12, .seed = 0, .shuffle = false, .repeat = false});
    const auto batch = *loader.next();
    const std::size_t nt = 12, ne = 3, ns = 2;
    Tensor<double> u({1, nt, ne}), resets({1, nt});
    for (std::size_t t = 0; t < nt; ++t) {
        const int token = batch.inputs(0, t);
        resets(0, t) = token == int(olmax::data::ByteTokenizer::end_of_document);
        for (std::size_t e = 0; e < ne; ++e) u(0, t, e) = std::sin(0.1 * token + double(e));
    }
    auto in = make_inputs(1, nt, ne, ns, 7);
    in.u = u;
    const auto packed = sc::selective_scan(in.u, in.delta, in.A, in.B, in.C, in.D, {.resets = resets, .chunk = 5});
    std::size_t documents = 0;
    for (std::size_t start = 0; start < nt;) {
        std::size_t end = start + 1;
        while (end < nt && resets(0, end) == 0) ++end;
        auto part = [&](const Tensor<double>& t) { return olmax::slice(t, 1, start, end); };
        const auto alone = sc::selective_scan(part(in.u), part(in.delta), in.A, part(in.B), part(in.C), in.D);
        CHECK(olmax_test::max_abs_diff(alone.y, part(packed.y)) < 1e-14);
        ++documents;
        start = end;
    }
    CHECK(documents == 3);
}

TEST_CASE("scan::selective_scan: float agrees with double", "[selective_ssm]") {
    const auto in = make_inputs(2, 50, 8, 4, 8);
    const auto d = sc::selective_scan(in.u, in.delta, in.A, in.B, in.C, in.D, {.h0 = in.h0});
    auto f = [](const Tensor<double>& t) { return olmax::cast<float>(t); };
    const auto s = sc::selective_scan(f(in.u), f(in.delta), f(in.A), f(in.B), f(in.C), f(in.D), {.h0 = f(in.h0)});
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(s.y), d.y) < 1e-4);
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(s.h_last), d.h_last) < 1e-4);
}

TEST_CASE("scan::selective_scan: bad shapes throw shape_error naming the op and shapes", "[selective_ssm]") {
    const auto in = make_inputs(2, 5, 4, 3, 9);
    using Catch::Matchers::Contains;
    auto call = [&](const Tensor<double>& u, const Tensor<double>& delta, const Tensor<double>& A, const Tensor<double>& B,
                    const Tensor<double>& C, const Tensor<double>& D, const sc::SelectiveScanOptions<double>& opt) {
        return sc::selective_scan(u, delta, A, B, C, D, opt);
    };
    CHECK_THROWS_WITH(call(olmax::reshape(in.u, {10, 4}), in.delta, in.A, in.B, in.C, in.D, {}), Contains("selective_scan") && Contains("[10, 4]"));
    CHECK_THROWS_AS(call(in.u, Tensor<double>({2, 5, 3}), in.A, in.B, in.C, in.D, {}), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.u, in.delta, Tensor<double>({5, 3}), in.B, in.C, in.D, {}), Contains("A of shape [5, 3]") && Contains("E = 4"));
    CHECK_THROWS_AS(call(in.u, in.delta, in.A, Tensor<double>({3, 5, 3}), in.C, in.D, {}), olmax::shape_error);  // batch
    CHECK_THROWS_WITH(call(in.u, in.delta, in.A, in.B, Tensor<double>({2, 5, 4}), in.D, {}), Contains("C of shape [2, 5, 4]"));  // N
    CHECK_THROWS_AS(call(in.u, in.delta, in.A, in.B, Tensor<double>({2, 4, 3}), in.D, {}), olmax::shape_error);  // T
    CHECK_THROWS_AS(call(in.u, in.delta, in.A, in.B, in.C, Tensor<double>({3}), {}), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.u, in.delta, in.A, in.B, in.C, in.D, {.h0 = Tensor<double>({2, 4, 2})}), Contains("h0 of shape [2, 4, 2]"));
    CHECK_THROWS_AS(call(in.u, in.delta, in.A, in.B, in.C, in.D, {.resets = Tensor<double>({2, 6})}), olmax::shape_error);
    CHECK_THROWS_AS(call(in.u, in.delta, in.A, in.B, in.C, in.D, {.chunk = 0}), olmax::value_error);
    CHECK_THROWS_AS(call(Tensor<double>({2, 0, 4}), Tensor<double>({2, 0, 4}), in.A, Tensor<double>({2, 0, 3}), Tensor<double>({2, 0, 3}), in.D, {}),
                    olmax::value_error);
    CHECK_THROWS_AS(call(Tensor<double>(), in.delta, in.A, in.B, in.C, in.D, {}), olmax::value_error);
}

TEST_CASE("nn::SelectiveSSM: layer contract, parameters and Mamba's initialisation", "[selective_ssm]") {
    static_assert(nn::assert_layer<nn::SelectiveSSM<float>>());
    static_assert(nn::assert_layer<nn::SelectiveSSM<double>>());
    nn::Config config;
    config.features = 40;
    nn::Module<nn::SelectiveSSM<double>> module(config);
    const auto params = module.parameters();
    REQUIRE(params.size() == 9);
    const std::size_t E = 80, N = 16, K = 4, R = 3;  // E = 2 D, R = ceil(40 / 16)
    CHECK(params[0].name == "selective_ssm/in_proj/weight");
    CHECK(params[0].tensor.shape() == olmax::Shape{40, 2 * E});
    CHECK(params[1].tensor.shape() == olmax::Shape{K, E});
    CHECK(params[3].tensor.shape() == olmax::Shape{E, R + 2 * N});
    CHECK(params[4].tensor.shape() == olmax::Shape{R, E});
    CHECK(params[6].name == "selective_ssm/A_log");
    CHECK(params[6].role == nn::Role::other);
    CHECK(params[7].role == nn::Role::other);
    CHECK(params[8].tensor.shape() == olmax::Shape{E, 40});
    for (std::size_t e = 0; e < E; ++e) {
        for (std::size_t n = 0; n < N; ++n) CHECK(params[6].tensor(e, n) == Approx(std::log(double(n + 1))));
        CHECK(params[7].tensor(e) == 1.0);
        const double dt = std::log1p(std::exp(params[5].tensor(e)));  // softplus(dt_bias)
        CHECK(dt >= 1e-3 * (1 - 1e-9));
        CHECK(dt <= 1e-1 * (1 + 1e-9));
    }
    olmax::Generator rng(1);
    auto x = olmax::randn<double>({2, 7, 40}, rng);
    CHECK(module(x).shape() == x.shape());
}

TEST_CASE("nn::SelectiveSSM: gradients (double) of input and every parameter, with resets", "[selective_ssm][grad]") {
    olmax::Generator rng(11);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    auto params = ssm_parameters(layer);
    const Tensor<double> x = olmax::randn<double>({2, 6, 3}, rng);
    Tensor<double> resets({2, 6});
    resets(0, 2) = 1;
    resets(1, 4) = 1;
    auto f = [&](const std::vector<Tensor<double>>& in) {
        bind_parameters(layer, std::vector<Tensor<double>>(in.begin() + 1, in.end()));
        return layer.forward(in[0], resets);
    };
    std::vector<Tensor<double>> inputs{x};
    inputs.insert(inputs.end(), params.begin(), params.end());
    olmax_test::check_gradients(f, inputs);
}

TEST_CASE("nn::SelectiveSSM: gradients (double) through the carried state", "[selective_ssm][grad]") {
    olmax::Generator rng(12);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    const Tensor<double> x = olmax::randn<double>({2, 4, 3}, rng);
    const Tensor<double> ssm = olmax::randn<double>({2, 5, 3}, rng), conv = olmax::randn<double>({2, 2, 5}, rng);
    Tensor<double> resets({2, 4});
    resets(1, 1) = 1;
    auto f = [&](const std::vector<Tensor<double>>& in) {
        const auto out = layer.forward_with_state(in[0], {in[1], in[2]}, resets);
        return olmax::concat({olmax::reshape(out.y, {out.y.size()}), olmax::reshape(out.state.ssm, {out.state.ssm.size()}),
                              olmax::reshape(out.state.conv, {out.state.conv.size()})},
                             0);
    };
    olmax_test::check_gradients(f, {x, ssm, conv});
}

TEST_CASE("nn::SelectiveSSM: a packed pair with a reset equals the two sequences run alone", "[selective_ssm]") {
    olmax::Generator rng(13);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    const std::size_t first = 4, total = 11;
    const Tensor<double> x = olmax::randn<double>({1, total, 3}, rng);
    Tensor<double> resets({1, total});
    resets(0, first) = 1;
    const auto packed = layer.forward(x, resets);
    const auto one = layer.forward(olmax::slice(x, 1, 0, first));
    const auto two = layer.forward(olmax::slice(x, 1, first, total));
    CHECK(olmax_test::max_abs_diff(packed, olmax::concat({one, two}, 1)) < 1e-13);
    // Without the reset the second document sees the first (the check above is not vacuous).
    CHECK(olmax_test::max_abs_diff(olmax::slice(layer.forward(x), 1, first, total), two) > 1e-6);
}

TEST_CASE("nn::SelectiveSSM: running in pieces with the carried state equals one call", "[selective_ssm]") {
    olmax::Generator rng(14);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    const std::size_t total = 13;
    const Tensor<double> x = olmax::randn<double>({2, total, 3}, rng);
    Tensor<double> resets({2, total});
    resets(0, 5) = 1;  // inside the first piece, within K-1 of its end: the carried conv inputs must stop there
    resets(1, 7) = 1;
    const auto whole = layer.forward_with_state(x, {}, resets);
    nn::SelectiveSSMState<double> state;
    std::vector<Tensor<double>> pieces;
    for (auto [begin, end] : {std::pair<std::size_t, std::size_t>{0, 6}, {6, 7}, {7, 13}}) {
        const auto out = layer.forward_with_state(olmax::slice(x, 1, begin, end), state, olmax::slice(resets, 1, begin, end));
        pieces.push_back(out.y);
        state = out.state;
    }
    CHECK(olmax_test::max_abs_diff(olmax::concat(pieces, 1), whole.y) < 1e-13);
    CHECK(olmax_test::max_abs_diff(state.ssm, whole.state.ssm) < 1e-13);
    CHECK(olmax_test::max_abs_diff(state.conv, whole.state.conv) < 1e-13);
}

TEST_CASE("nn::SelectiveSSM: causal, and float runs", "[selective_ssm]") {
    olmax::Generator rng(15);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    const Tensor<double> x = olmax::randn<double>({1, 9, 3}, rng);
    Tensor<double> changed = x.clone();
    for (std::size_t f = 0; f < 3; ++f) changed(0, 6, f) += 1.0;
    const auto a = layer.forward(x), b = layer.forward(changed);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 0, 6), olmax::slice(b, 1, 0, 6)) == 0);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 6, 9), olmax::slice(b, 1, 6, 9)) > 0);

    nn::SelectiveSSMConfig config;
    config.features = 8;
    olmax::Generator rng_f(16);
    nn::SelectiveSSM<float> layer_f(config, rng_f);
    auto xf = olmax::parameter(olmax::randn<float>({2, 33, 8}, rng_f));
    auto y = layer_f.forward(xf);
    olmax::sum(olmax::square(y)).backward();
    REQUIRE(xf.grad().defined());
    for (float v : xf.grad()) REQUIRE(std::isfinite(v));
}

TEST_CASE("nn::SelectiveSSM: bad sizes and inputs throw", "[selective_ssm]") {
    olmax::Generator rng(17);
    auto config = small_ssm_config();
    config.state = 0;
    CHECK_THROWS_AS(nn::SelectiveSSM<double>(config, rng), olmax::value_error);
    nn::SelectiveSSM<double> layer(small_ssm_config(), rng);
    CHECK_THROWS_WITH(layer.forward(Tensor<double>({1, 4, 5})), Catch::Matchers::Contains("expected input [batch, T, 3]"));
    CHECK_THROWS_AS(layer.forward(Tensor<double>({4, 3})), olmax::shape_error);
    CHECK_THROWS_AS(layer.forward(Tensor<double>({1, 0, 3})), olmax::value_error);
    CHECK_THROWS_AS(layer.forward(Tensor<double>({0, 4, 3})), olmax::value_error);
    CHECK_THROWS_AS(layer.forward(Tensor<double>({2, 4, 3}), Tensor<double>({2, 5})), olmax::shape_error);
    CHECK_THROWS_AS(layer.forward_with_state(Tensor<double>({2, 4, 3}), {Tensor<double>({2, 5, 4}), {}}), olmax::shape_error);
    CHECK_THROWS_AS(layer.forward_with_state(Tensor<double>({2, 4, 3}), {{}, Tensor<double>({2, 3, 5})}), olmax::shape_error);
}

TEST_CASE("scan::selective_scan: the serial host kernels give the same bits as the default ones", "[selective_ssm]") {
    auto in = make_inputs(3, 30, 40, 5, 18);  // several channel blocks and tasks per thread
    in.resets(2, 13) = 1;
    olmax::Generator rng(180);
    const auto dy = olmax::randn<double>(in.u.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsmRun parallel = run_op(in, true, true, dy, dh_last);
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    const SsmRun one_thread = run_op(in, true, true, dy, dh_last);
    check_identical(parallel, one_thread);
}

TEST_CASE("nn::SelectiveSSM: works inside nn::Stack (stacked parameters)", "[selective_ssm]") {
    nn::Config config;
    config.features = 4;
    config.seed = 3;
    nn::Stack<nn::SelectiveSSM<double>> stack(config, 2);
    olmax::Generator rng(19);
    auto x = olmax::parameter(olmax::randn<double>({2, 10, 4}, rng));
    auto y = stack.forward(x);
    CHECK(y.shape() == x.shape());
    olmax::sum(olmax::square(y)).backward();
    REQUIRE(x.grad().defined());
    for (const auto& p : nn::parameters(stack)) {
        INFO(p.name);
        CHECK(p.tensor.grad().defined());
    }
}
