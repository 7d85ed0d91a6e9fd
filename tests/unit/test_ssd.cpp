// scan::ssd (Mamba-2's chunked SSD) and nn::Mamba2: the chunked op against a sequential reference
// recurrence with its hand-written adjoint, finite-difference gradients in double, causality,
// packed-sequence resets, carried state, bad shapes.
#include "test_helpers.hpp"
#include "traced_constants.hpp"

#include "olmax/backend/bf16_matmul_kernels.hpp"
#include "olmax/nn/mamba2.hpp"
#include "olmax/scan/ssd.hpp"
#include <olmax/trace/trace.hpp>
#include <olmax/xla/graph/evaluate.hpp>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sc = olmax::scan;
namespace nn = olmax::nn;
using olmax::Tensor;

namespace {

/// The op's inputs at sizes batch, T, heads H of P channels, groups G, state N: dt > 0, A < 0.
struct SsdInputs {
    Tensor<double> x, dt, A, B, C, D, h0, resets;
    std::vector<Tensor<double>> differentiable() const { return {x, dt, A, B, C, D, h0}; }
};

SsdInputs ssd_make_inputs(std::size_t batch, std::size_t time, std::size_t heads, std::size_t head_dim, std::size_t groups, std::size_t state,
                          std::uint64_t seed) {
    olmax::Generator rng(seed);
    SsdInputs in;
    in.x = olmax::randn<double>({batch, time, heads, head_dim}, rng);
    in.dt = olmax_test::uniform({batch, time, heads}, rng, 0.05, 0.8);
    in.A = olmax_test::uniform({heads}, rng, -2.0, -0.2);
    in.B = olmax::randn<double>({batch, time, groups, state}, rng);
    in.C = olmax::randn<double>({batch, time, groups, state}, rng);
    in.D = olmax::randn<double>({heads}, rng);
    in.h0 = olmax::randn<double>({batch, heads, head_dim, state}, rng);
    in.resets = Tensor<double>({batch, time});
    return in;
}

/// y and h_last flattened into one vector (for the gradient checker).
Tensor<double> ssd_flat(const sc::SsdResult<double>& r) {
    return olmax::concat({olmax::reshape(r.y, {r.y.size()}), olmax::reshape(r.h_last, {r.h_last.size()})}, 0);
}

/// The sequential recurrence h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t
/// written out step by step with every state stored, and its adjoint by hand:
///     g_t = dy_t C_t^T + abar_{t+1} g_{t+1}    (adjoint of h_t; g_{T-1} adds dh_last)
///     dx_t = D dy_t + dt_t g_t B_t,  ddt_t = x_t . (g_t B_t) + A abar_t <g_t, h_{t-1}>
///     dA += dt_t abar_t <g_t, h_{t-1}>,  dB_t += dt_t g_t^T x_t,  dC_t += h_t^T dy_t,  dh0 = abar_0 g_0
/// (abar_t = 0 at a reset).
struct SsdReference {
    std::vector<double> y, h_last, dx, ddt, dA, dB, dC, dD, dh0;
};

SsdReference ssd_reference(const SsdInputs& in, bool use_h0, bool use_resets, bool use_D, const Tensor<double>& dy, const Tensor<double>& dh_last) {
    const std::size_t nb = in.x.extent(0), nt = in.x.extent(1), nh = in.x.extent(2), np = in.x.extent(3), ng = in.B.extent(2),
                      ns = in.B.extent(3), hpg = nh / ng, pn = np * ns;
    SsdReference r;
    r.y.assign(nb * nt * nh * np, 0);
    r.h_last.assign(nb * nh * pn, 0);
    r.dx.assign(r.y.size(), 0);
    r.ddt.assign(nb * nt * nh, 0);
    r.dA.assign(nh, 0);
    r.dB.assign(nb * nt * ng * ns, 0);
    r.dC.assign(r.dB.size(), 0);
    r.dD.assign(nh, 0);
    r.dh0.assign(r.h_last.size(), 0);
    for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t h = 0; h < nh; ++h) {
            const std::size_t grp = h / hpg;
            const double A = in.A(h), D = use_D ? in.D(h) : 0.0;
            std::vector<double> hs((nt + 1) * pn, 0.0), abar(nt, 0.0);  // hs[0] = h_{-1}
            if (use_h0)
                for (std::size_t i = 0; i < pn; ++i) hs[i] = in.h0.data()[(b * nh + h) * pn + i];
            for (std::size_t t = 0; t < nt; ++t) {
                const bool reset = use_resets && in.resets(b, t) != 0;
                const double dt = in.dt(b, t, h);
                abar[t] = reset ? 0.0 : std::exp(dt * A);
                for (std::size_t p = 0; p < np; ++p) {
                    double acc = 0;
                    for (std::size_t n = 0; n < ns; ++n) {
                        double& cur = hs[(t + 1) * pn + p * ns + n];
                        cur = abar[t] * hs[t * pn + p * ns + n] + dt * in.x(b, t, h, p) * in.B(b, t, grp, n);
                        acc += cur * in.C(b, t, grp, n);
                    }
                    r.y[((b * nt + t) * nh + h) * np + p] = acc + D * in.x(b, t, h, p);
                }
            }
            for (std::size_t i = 0; i < pn; ++i) r.h_last[(b * nh + h) * pn + i] = hs[nt * pn + i];
            std::vector<double> g(pn);
            for (std::size_t i = 0; i < pn; ++i) g[i] = dh_last.data()[(b * nh + h) * pn + i];
            for (std::size_t t = nt; t-- > 0;) {
                const double dt = in.dt(b, t, h);
                double ddt = 0, gh = 0;
                for (std::size_t p = 0; p < np; ++p) {
                    const double dyp = dy(b, t, h, p), xp = in.x(b, t, h, p);
                    double gb = 0;
                    for (std::size_t n = 0; n < ns; ++n) {
                        double& gn = g[p * ns + n];
                        gn += dyp * in.C(b, t, grp, n);
                        gb += gn * in.B(b, t, grp, n);
                        gh += gn * hs[t * pn + p * ns + n];
                        r.dB[((b * nt + t) * ng + grp) * ns + n] += gn * dt * xp;
                        r.dC[((b * nt + t) * ng + grp) * ns + n] += dyp * hs[(t + 1) * pn + p * ns + n];
                    }
                    r.dx[((b * nt + t) * nh + h) * np + p] = D * dyp + dt * gb;
                    ddt += xp * gb;
                    if (use_D) r.dD[h] += dyp * xp;
                }
                r.ddt[(b * nt + t) * nh + h] = ddt + A * abar[t] * gh;
                r.dA[h] += dt * abar[t] * gh;
                for (double& gn : g) gn *= abar[t];
            }
            for (std::size_t i = 0; i < pn; ++i) r.dh0[(b * nh + h) * pn + i] = g[i];
        }
    return r;
}

/// max |a - b| / max |b|: the normwise relative error of a tensor against the reference.
double ssd_relative_error(const Tensor<double>& a, const std::vector<double>& b) {
    REQUIRE(a.size() == b.size());
    double err = 0, scale = 1e-300;
    for (std::size_t i = 0; i < b.size(); ++i) {
        err = olmax_test::worse(err, std::abs(a.data()[i] - b[i]));
        scale = std::max(scale, std::abs(b[i]));
    }
    return err / scale;
}

/// The op's values and input gradients for output gradients dy, dh_last.
struct SsdRun {
    Tensor<double> y, h_last, dx, ddt, dA, dB, dC, dD, dh0;
};

SsdRun ssd_run_op(const SsdInputs& base, bool use_h0, bool use_resets, bool use_D, const Tensor<double>& dy, const Tensor<double>& dh_last,
                  std::optional<long> chunk) {
    std::vector<Tensor<double>> v;
    for (const auto& t : base.differentiable()) v.push_back(olmax::parameter(t.clone()));
    auto r = sc::ssd(v[0], v[1], v[2], v[3], v[4], use_D ? v[5] : Tensor<double>(),
                     {.h0 = use_h0 ? v[6] : Tensor<double>(), .resets = use_resets ? base.resets : Tensor<double>(), .chunk = chunk});
    auto loss = olmax::add(olmax::sum(olmax::mul(r.y, dy)), olmax::sum(olmax::mul(r.h_last, dh_last)));
    loss.backward();
    return {r.y.detach(), r.h_last.detach(), v[0].grad(), v[1].grad(), v[2].grad(), v[3].grad(), v[4].grad(),
            use_D ? v[5].grad() : Tensor<double>(), use_h0 ? v[6].grad() : Tensor<double>()};
}

/// Every output and gradient of the op within `tol` (normwise relative) of the reference.
void ssd_check_against(const SsdRun& op, const SsdReference& ref, bool use_h0, bool use_D, double tol) {
    CHECK(ssd_relative_error(op.y, ref.y) < tol);
    CHECK(ssd_relative_error(op.h_last, ref.h_last) < tol);
    CHECK(ssd_relative_error(op.dx, ref.dx) < tol);
    CHECK(ssd_relative_error(op.ddt, ref.ddt) < tol);
    CHECK(ssd_relative_error(op.dA, ref.dA) < tol);
    CHECK(ssd_relative_error(op.dB, ref.dB) < tol);
    CHECK(ssd_relative_error(op.dC, ref.dC) < tol);
    if (use_D) CHECK(ssd_relative_error(op.dD, ref.dD) < tol);
    if (use_h0) CHECK(ssd_relative_error(op.dh0, ref.dh0) < tol);
}

std::vector<Tensor<double>> ssd_layer_parameters(nn::Mamba2<double>& layer) {
    std::vector<Tensor<double>> out;
    nn::ParameterVisitor<double> visit([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { out.push_back(t.detach().clone()); });
    layer.visit_parameters(visit);
    return out;
}

void ssd_bind_parameters(nn::Mamba2<double>& layer, const std::vector<Tensor<double>>& params) {
    std::size_t i = 0;
    nn::ParameterVisitor<double> visit([&](const std::string&, Tensor<double>& t, nn::Role, nn::Sharing) { t = params[i++]; });
    layer.visit_parameters(visit);
}

/// D = 4, E = 8, P = 2 (H = 4 heads), N = 3, G = 2, K = 3, Q = 3.
nn::Mamba2Config ssd_small_config(std::size_t groups = 2) {
    nn::Mamba2Config c;
    c.features = 4;
    c.head_dim = 2;
    c.state = 3;
    c.groups = groups;
    c.conv_kernel = 3;
    c.chunk = 3;
    return c;
}

}  // namespace

TEST_CASE("scan::ssd: matches the sequential reference, forward and backward, for several chunk lengths", "[ssd]") {
    // T = 37 is a multiple of none of the chunk lengths but 1 and 37; H = 4 heads in G = 2 groups.
    auto in = ssd_make_inputs(2, 37, 4, 3, 2, 5, 1);
    for (std::size_t t : {0u, 6u, 7u, 20u, 36u}) in.resets(1, t) = 1;  // at a chunk start (t = 21 for Q = 7), inside, at the end
    in.resets(0, 21) = 1;
    olmax::Generator rng(10);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    for (bool use_resets : {false, true})
        for (bool use_h0 : {false, true}) {
            const bool use_D = use_h0;  // D present in half the runs
            const SsdReference ref = ssd_reference(in, use_h0, use_resets, use_D, dy, dh_last);
            for (long chunk : {1L, 3L, 7L, 16L, 37L, 64L}) {
                INFO("resets " << use_resets << ", h0 and D " << use_h0 << ", chunk " << chunk);
                ssd_check_against(ssd_run_op(in, use_h0, use_resets, use_D, dy, dh_last, chunk), ref, use_h0, use_D, 1e-12);
            }
        }
}

TEST_CASE("scan::ssd: one group per head and one head per group match the reference", "[ssd]") {
    olmax::Generator rng(11);
    for (auto [heads, groups] : {std::pair<std::size_t, std::size_t>{3, 3}, {3, 1}, {1, 1}}) {
        auto in = ssd_make_inputs(3, 23, heads, 2, groups, 4, 2 + heads + groups);
        in.resets(2, 9) = 1;
        const auto dy = olmax::randn<double>(in.x.shape(), rng);
        const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
        const SsdReference ref = ssd_reference(in, true, true, true, dy, dh_last);
        for (long chunk : {4L, 8L}) {
            INFO("H " << heads << ", G " << groups << ", chunk " << chunk);
            ssd_check_against(ssd_run_op(in, true, true, true, dy, dh_last, chunk), ref, true, true, 1e-12);
        }
    }
}

TEST_CASE("scan::ssd: gradients (double) of x, dt, A, B, C, D and h0 by finite differences, with resets", "[ssd][grad]") {
    auto in = ssd_make_inputs(2, 9, 4, 2, 2, 3, 3);
    in.resets(0, 4) = 1;  // a second document mid-row
    in.resets(1, 0) = 1;  // h0 does not reach this row
    in.resets(1, 6) = 1;
    for (long chunk : {1L, 4L, 64L}) {
        auto f = [&](const std::vector<Tensor<double>>& v) {
            return ssd_flat(sc::ssd(v[0], v[1], v[2], v[3], v[4], v[5], {.h0 = v[6], .resets = in.resets, .chunk = chunk}));
        };
        INFO("chunk " << chunk);
        olmax_test::check_gradients(f, in.differentiable());
    }
}

TEST_CASE("scan::ssd: gradients (double) without h0, D or resets", "[ssd][grad]") {
    auto in = ssd_make_inputs(1, 11, 2, 3, 1, 2, 4);
    auto f = [&](const std::vector<Tensor<double>>& v) { return ssd_flat(sc::ssd(v[0], v[1], v[2], v[3], v[4], Tensor<double>(), {.chunk = 4})); };
    olmax_test::check_gradients(f, {in.x, in.dt, in.A, in.B, in.C});
}

TEST_CASE("scan::ssd: causal, changing step t changes no output before t", "[ssd]") {
    const auto in = ssd_make_inputs(2, 17, 2, 3, 1, 4, 5);
    const auto base = sc::ssd(in.x, in.dt, in.A, in.B, in.C, in.D, {.h0 = in.h0, .chunk = 5});
    for (std::size_t t : {0u, 4u, 5u, 16u}) {
        auto changed = in;
        changed.x = in.x.clone();
        changed.dt = in.dt.clone();
        changed.B = in.B.clone();
        changed.C = in.C.clone();
        for (std::size_t b = 0; b < 2; ++b) {
            for (std::size_t h = 0; h < 2; ++h) {
                changed.dt(b, t, h) += 0.3;
                for (std::size_t p = 0; p < 3; ++p) changed.x(b, t, h, p) += 1.5;
            }
            for (std::size_t n = 0; n < 4; ++n) changed.B(b, t, 0, n) -= 0.7, changed.C(b, t, 0, n) += 0.9;
        }
        const auto r = sc::ssd(changed.x, changed.dt, changed.A, changed.B, changed.C, changed.D, {.h0 = in.h0, .chunk = 5});
        for (std::size_t s = 0; s < 17; ++s) {
            const double diff = olmax_test::max_abs_diff(olmax::slice(r.y, 1, s, s + 1), olmax::slice(base.y, 1, s, s + 1));
            INFO("changed t " << t << ", output s " << s);
            if (s < t) CHECK(diff == 0);
            else if (s == t) CHECK(diff > 0);
        }
    }
}

TEST_CASE("scan::ssd: a packed pair with a reset equals the two sequences run alone", "[ssd]") {
    const std::size_t first = 7, total = 19;
    auto packed = ssd_make_inputs(1, total, 4, 2, 2, 3, 6);
    packed.resets(0, first) = 1;
    auto part = [&](const Tensor<double>& t, std::size_t begin, std::size_t end) { return olmax::slice(t, 1, begin, end).detach(); };
    olmax::Generator rng(60);
    const auto dy = olmax::randn<double>(packed.x.shape(), rng);
    const auto zero_state = Tensor<double>(packed.h0.shape());
    const SsdRun both = ssd_run_op(packed, true, true, true, dy, zero_state, 4);  // the reset falls inside a chunk
    auto alone = [&](std::size_t begin, std::size_t end, bool with_h0) {
        SsdInputs in = packed;
        in.x = part(packed.x, begin, end);
        in.dt = part(packed.dt, begin, end);
        in.B = part(packed.B, begin, end);
        in.C = part(packed.C, begin, end);
        in.resets = Tensor<double>({1, end - begin});
        return ssd_run_op(in, with_h0, false, true, part(dy, begin, end), zero_state, 4);
    };
    const SsdRun one = alone(0, first, true), two = alone(first, total, false);
    auto joined = [](const Tensor<double>& a, const Tensor<double>& b) { return olmax::concat({a, b}, 1); };
    const double tol = 1e-12;
    CHECK(olmax_test::max_abs_diff(both.y, joined(one.y, two.y)) < tol);
    CHECK(olmax_test::max_abs_diff(both.h_last, two.h_last) < tol);
    CHECK(olmax_test::max_abs_diff(both.dx, joined(one.dx, two.dx)) < tol);
    CHECK(olmax_test::max_abs_diff(both.ddt, joined(one.ddt, two.ddt)) < tol);
    CHECK(olmax_test::max_abs_diff(both.dB, joined(one.dB, two.dB)) < tol);
    CHECK(olmax_test::max_abs_diff(both.dC, joined(one.dC, two.dC)) < tol);
    CHECK(olmax_test::max_abs_diff(both.dA, olmax::add(one.dA, two.dA)) < tol);
    CHECK(olmax_test::max_abs_diff(both.dD, olmax::add(one.dD, two.dD)) < tol);
    CHECK(olmax_test::max_abs_diff(both.dh0, one.dh0) < tol);  // h0 reaches the first document only
    // Without the reset the second document sees the first (the checks above are not vacuous).
    const auto unreset = sc::ssd(packed.x, packed.dt, packed.A, packed.B, packed.C, packed.D, {.h0 = packed.h0, .chunk = 4});
    CHECK(olmax_test::max_abs_diff(olmax::slice(unreset.y, 1, first, total), two.y) > 1e-3);
}

TEST_CASE("scan::ssd: two calls with the state carried equal one call", "[ssd]") {
    auto in = ssd_make_inputs(2, 29, 4, 2, 2, 3, 7);
    in.resets(1, 17) = 1;
    const auto whole = sc::ssd(in.x, in.dt, in.A, in.B, in.C, in.D, {.h0 = in.h0, .resets = in.resets, .chunk = 8});
    const std::size_t cut = 13;
    auto part = [&](const Tensor<double>& t, std::size_t begin, std::size_t end) { return olmax::slice(t, 1, begin, end); };
    const auto a = sc::ssd(part(in.x, 0, cut), part(in.dt, 0, cut), in.A, part(in.B, 0, cut), part(in.C, 0, cut), in.D,
                           {.h0 = in.h0, .resets = part(in.resets, 0, cut), .chunk = 8});
    const auto b = sc::ssd(part(in.x, cut, 29), part(in.dt, cut, 29), in.A, part(in.B, cut, 29), part(in.C, cut, 29), in.D,
                           {.h0 = a.h_last, .resets = part(in.resets, cut, 29), .chunk = 8});
    CHECK(olmax_test::max_abs_diff(olmax::concat({a.y, b.y}, 1), whole.y) < 1e-12);
    CHECK(olmax_test::max_abs_diff(b.h_last, whole.h_last) < 1e-12);
}

TEST_CASE("scan::ssd: float agrees with double, and the serial kernels agree with the default ones", "[ssd]") {
    const auto in = ssd_make_inputs(2, 40, 4, 8, 2, 8, 8);
    const auto d = sc::ssd(in.x, in.dt, in.A, in.B, in.C, in.D, {.h0 = in.h0, .chunk = 16});
    auto f = [](const Tensor<double>& t) { return olmax::cast<float>(t); };
    const auto s = sc::ssd(f(in.x), f(in.dt), f(in.A), f(in.B), f(in.C), f(in.D), {.h0 = f(in.h0), .chunk = 16});
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(s.y), d.y) < 1e-4);
    CHECK(olmax_test::max_abs_diff(olmax::cast<double>(s.h_last), d.h_last) < 1e-4);

    olmax::Generator rng(80);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsdRun parallel = ssd_run_op(in, true, false, true, dy, dh_last, 16);
    olmax::backend::host_kernels_scope serial(olmax::backend::kernels<olmax::backend::cpu_serial>());
    const SsdRun one_thread = ssd_run_op(in, true, false, true, dy, dh_last, 16);
    for (auto [a, b] : {std::pair{&parallel.y, &one_thread.y}, {&parallel.dx, &one_thread.dx}, {&parallel.ddt, &one_thread.ddt},
                        {&parallel.dA, &one_thread.dA}, {&parallel.dB, &one_thread.dB}, {&parallel.dC, &one_thread.dC},
                        {&parallel.dh0, &one_thread.dh0}})
        CHECK(olmax_test::max_abs_diff(*a, *b) < 1e-12);
}

TEST_CASE("scan::ssd: under the bf16 policy its float products round their operands, as every float GEMM does", "[ssd][bf16]") {
    auto in = ssd_make_inputs(2, 40, 4, 8, 2, 8, 9);
    in.resets(1, 13) = 1;
    olmax::Generator rng(81);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsdReference ref = ssd_reference(in, true, true, true, dy, dh_last);
    auto run = [&](bool bf16) {
        std::optional<olmax::backend::bf16_matmul_scope> policy;
        if (bf16) policy.emplace();
        auto f = [](const Tensor<double>& t) { return olmax::cast<float>(t); };
        std::vector<Tensor<float>> v;
        for (const auto& t : in.differentiable()) v.push_back(olmax::parameter(f(t)));
        auto r = sc::ssd(v[0], v[1], v[2], v[3], v[4], v[5], {.h0 = v[6], .resets = f(in.resets), .chunk = 16});
        olmax::add(olmax::sum(olmax::mul(r.y, f(dy))), olmax::sum(olmax::mul(r.h_last, f(dh_last)))).backward();
        auto d = [](const Tensor<float>& t) { return olmax::cast<double>(t.detach()); };
        return SsdRun{d(r.y), d(r.h_last), d(v[0].grad()), d(v[1].grad()), d(v[2].grad()), d(v[3].grad()), d(v[4].grad()), d(v[5].grad()),
                      d(v[6].grad())};
    };
    const SsdRun fp32 = run(false), bf16 = run(true);
    ssd_check_against(fp32, ref, true, true, 1e-5);
    ssd_check_against(bf16, ref, true, true, 3e-2);  // bf16 operands: ~3 significant digits
    CHECK(olmax_test::max_abs_diff(bf16.y, fp32.y) > 1e-4);  // and the policy did apply
    CHECK(olmax_test::max_abs_diff(bf16.dx, fp32.dx) > 1e-4);
}

TEST_CASE("scan::ssd_forward / ssd_backward on caller-owned buffers give the op's results bit for bit", "[ssd]") {
    auto in = ssd_make_inputs(2, 13, 4, 3, 2, 5, 12);  // two heads per group: the head sums of dB and dC run
    in.resets(1, 5) = 1;
    olmax::Generator rng(120);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsdRun op = ssd_run_op(in, true, true, true, dy, dh_last, 4);
    const sc::SsdSizes sizes{2, 13, 4, 3, 2, 5, 4};
    const sc::SsdBuffers<double> buffers{in.x.data(), in.dt.data(), in.A.data(), in.B.data(), in.C.data(), in.D.data(), in.h0.data(), in.resets.data()};
    SsdRun raw{Tensor<double>(op.y.shape()),  Tensor<double>(op.h_last.shape()), Tensor<double>(op.dx.shape()),
               Tensor<double>(op.ddt.shape()), Tensor<double>(op.dA.shape()),     Tensor<double>(op.dB.shape()),
               Tensor<double>(op.dC.shape()),  Tensor<double>(op.dD.shape()),     Tensor<double>(op.dh0.shape())};
    Tensor<double> checkpoints({2, 4, 4, 3, 5});  // ceil(13 / 4) = 4 chunks
    sc::ssd_forward(sizes, buffers, raw.y.data(), raw.h_last.data(), checkpoints.data());
    sc::ssd_backward(sizes, buffers, dy.data(), dh_last.data(), checkpoints.data(),
                     sc::SsdGradients<double>{raw.dx.data(), raw.ddt.data(), raw.dA.data(), raw.dB.data(), raw.dC.data(), raw.dD.data(),
                                              raw.dh0.data()});
    for (auto [a, b] : {std::pair{&raw.y, &op.y}, {&raw.h_last, &op.h_last}, {&raw.dx, &op.dx}, {&raw.ddt, &op.ddt}, {&raw.dA, &op.dA},
                        {&raw.dB, &op.dB}, {&raw.dC, &op.dC}, {&raw.dD, &op.dD}, {&raw.dh0, &op.dh0}})
        CHECK(olmax_test::same_bits(*a, *b));
    CHECK_THROWS_WITH(sc::ssd_forward<double>(sc::SsdSizes{2, 13, 4, 3, 2, 5, 0}, buffers, raw.y.data(), raw.h_last.data(), nullptr),
                      Catch::Contains("scan::ssd") && Catch::Contains("must all be positive"));
    CHECK_THROWS_WITH(sc::ssd_forward<double>(sc::SsdSizes{2, 13, 4, 3, 3, 5, 4}, buffers, raw.y.data(), raw.h_last.data(), nullptr),
                      Catch::Contains("scan::ssd") && Catch::Contains("do not divide"));
}

TEST_CASE("scan::ssd: bad shapes and sizes throw errors naming the op", "[ssd]") {
    const auto in = ssd_make_inputs(2, 5, 4, 2, 2, 3, 9);
    using Catch::Matchers::Contains;
    auto call = [&](const Tensor<double>& x, const Tensor<double>& dt, const Tensor<double>& A, const Tensor<double>& B, const Tensor<double>& C,
                    const Tensor<double>& D, const sc::SsdOptions<double>& opt) { return sc::ssd(x, dt, A, B, C, D, opt); };
    REQUIRE_THROWS_AS(call(olmax::reshape(in.x, {10, 4, 2}), in.dt, in.A, in.B, in.C, in.D, {}), olmax::shape_error);
    CHECK_THROWS_WITH(call(olmax::reshape(in.x, {10, 4, 2}), in.dt, in.A, in.B, in.C, in.D, {}), Contains("scan::ssd") && Contains("[10, 4, 2]"));
    REQUIRE_THROWS_AS(call(in.x, Tensor<double>({2, 5, 3}), in.A, in.B, in.C, in.D, {}), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.x, Tensor<double>({2, 5, 3}), in.A, in.B, in.C, in.D, {}), Contains("scan::ssd: dt of shape [2, 5, 3]"));
    CHECK_THROWS_WITH(call(in.x, in.dt, Tensor<double>({3}), in.B, in.C, in.D, {}), Contains("scan::ssd: A of shape [3]"));
    CHECK_THROWS_AS(call(in.x, in.dt, in.A, Tensor<double>({3, 5, 2, 3}), in.C, in.D, {}), olmax::shape_error);  // batch
    CHECK_THROWS_AS(call(in.x, in.dt, in.A, Tensor<double>({2, 5, 2}), in.C, in.D, {}), olmax::shape_error);     // rank
    REQUIRE_THROWS_AS(call(in.x, in.dt, in.A, Tensor<double>({2, 5, 3, 3}), Tensor<double>({2, 5, 3, 3}), in.D, {}), olmax::shape_error);
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, Tensor<double>({2, 5, 3, 3}), Tensor<double>({2, 5, 3, 3}), in.D, {}),
                      Contains("scan::ssd: the H = 4 heads") && Contains("G = 3 groups"));
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, in.B, Tensor<double>({2, 5, 2, 4}), in.D, {}), Contains("scan::ssd: C of shape [2, 5, 2, 4]"));
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, in.B, in.C, Tensor<double>({3}), {}), Contains("scan::ssd: D of shape [3]"));
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, in.B, in.C, in.D, {.h0 = Tensor<double>({2, 4, 2, 2})}), Contains("scan::ssd: h0 of shape [2, 4, 2, 2]"));
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, in.B, in.C, in.D, {.resets = Tensor<double>({2, 6})}), Contains("scan::ssd: resets of shape [2, 6]"));
    REQUIRE_THROWS_AS(call(in.x, in.dt, in.A, in.B, in.C, in.D, {.chunk = 0}), olmax::value_error);
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, in.B, in.C, in.D, {.chunk = 0}), Contains("scan::ssd: chunk length must be >= 1"));
    REQUIRE_THROWS_AS(call(Tensor<double>({2, 0, 4, 2}), Tensor<double>({2, 0, 4}), in.A, Tensor<double>({2, 0, 2, 3}), Tensor<double>({2, 0, 2, 3}),
                           in.D, {}),
                      olmax::value_error);
    CHECK_THROWS_WITH(call(in.x, in.dt, in.A, Tensor<double>({2, 5, 2, 0}), Tensor<double>({2, 5, 2, 0}), in.D, {}), Contains("scan::ssd: B of shape"));
    CHECK_THROWS_AS(call(Tensor<double>(), in.dt, in.A, in.B, in.C, in.D, {}), olmax::value_error);
}

TEST_CASE("scan::ssd: the composed form of its traced path, run eagerly, matches the reference in values and tape gradients", "[ssd]") {
    // detail::ssd::composed (ordinary ops: what a traced call runs) on double tensors, its
    // gradients from the tape through those ops.
    auto in = ssd_make_inputs(2, 19, 4, 3, 2, 5, 13);
    for (std::size_t t : {0u, 4u, 5u, 18u}) in.resets(1, t) = 1;
    in.resets(0, 8) = 1;
    olmax::Generator rng(130);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    for (bool use_resets : {false, true}) {
        const SsdReference ref = ssd_reference(in, true, use_resets, true, dy, dh_last);
        for (long chunk : {1L, 4L, 5L, 19L, 32L}) {
            INFO("resets " << use_resets << ", chunk " << chunk);
            std::vector<Tensor<double>> v;
            for (const auto& t : in.differentiable()) v.push_back(olmax::parameter(t.clone()));
            const sc::SsdOptions<double> opt{.h0 = v[6], .resets = use_resets ? in.resets : Tensor<double>(), .chunk = chunk};
            const auto g = sc::detail::ssd::make_geometry(v[0], v[1], v[2], v[3], v[4], v[5], opt);
            const auto r = sc::detail::ssd::composed(g, v[0], v[1], v[2], v[3], v[4], v[5], opt.h0, opt.resets);
            olmax::add(olmax::sum(olmax::mul(r.y, dy)), olmax::sum(olmax::mul(r.h_last, dh_last))).backward();
            const SsdRun run{r.y.detach(), r.h_last.detach(), v[0].grad(), v[1].grad(), v[2].grad(), v[3].grad(), v[4].grad(), v[5].grad(), v[6].grad()};
            ssd_check_against(run, ref, true, true, 1e-11);
        }
    }
}

TEST_CASE("scan::ssd: traced, the program's values and tape gradients equal the eager op's", "[ssd][trace]") {
    namespace gx = olmax::xla::graph;
    auto in = ssd_make_inputs(2, 11, 4, 2, 2, 3, 14);
    in.resets(1, 3) = 1;
    in.resets(0, 8) = 1;
    olmax::Generator rng(140);
    const auto dy = olmax::randn<double>(in.x.shape(), rng);
    const auto dh_last = olmax::randn<double>(in.h0.shape(), rng);
    const SsdRun eager = ssd_run_op(in, true, true, true, dy, dh_last, 4);

    olmax::trace::tracing t;
    const std::vector<Tensor<double>> values{in.x, in.dt, in.A, in.B, in.C, in.D, in.h0, in.resets, dy, dh_last};
    std::vector<Tensor<float>> v;
    for (std::size_t k = 0; k < values.size(); ++k) v.push_back(t.input<float>(values[k].shape()).set_requires_grad(k < 7));
    const auto r = sc::ssd(v[0], v[1], v[2], v[3], v[4], v[5], {.h0 = v[6], .resets = v[7], .chunk = 4});
    olmax::add(olmax::sum(olmax::mul(r.y, v[8])), olmax::sum(olmax::mul(r.h_last, v[9]))).backward();
    std::vector<gx::var> wanted{olmax::trace::var_of(r.y), olmax::trace::var_of(r.h_last)};
    for (std::size_t k = 0; k < 7; ++k) wanted.push_back(olmax::trace::var_of(v[k].grad()));
    const gx::graph& graph = t.graph();
    std::vector<gx::host_value> host;
    REQUIRE(graph.inputs().size() == values.size());
    for (std::size_t k = 0; k < values.size(); ++k) {
        const auto& type = graph.at(graph.inputs()[k]).outputs[0];
        host.push_back(gx::host_value{type, std::vector<double>(values[k].begin(), values[k].end())});
    }
    const auto out = gx::evaluate(graph, host, wanted);  // in double precision
    const Tensor<double>* expected[] = {&eager.y, &eager.h_last, &eager.dx, &eager.ddt, &eager.dA, &eager.dB, &eager.dC, &eager.dD, &eager.dh0};
    for (std::size_t k = 0; k < wanted.size(); ++k) {
        INFO("output " << k);
        CHECK(ssd_relative_error(*expected[k], out[k].data) < 1e-11);
    }
}

TEST_CASE("scan::ssd: traced with host resets, the masks are computed in the program, not captured as constants", "[ssd][trace]") {
    const std::size_t B = 2, T = 64, H = 2, Q = 8;
    auto in = ssd_make_inputs(B, T, H, 2, 1, 3, 15);
    in.resets(0, 5) = 1;
    in.resets(1, 30) = 1;
    olmax::trace::tracing t;
    std::vector<Tensor<float>> v;
    for (const Tensor<double>* x : {&in.x, &in.dt, &in.A, &in.B, &in.C}) v.push_back(t.input<float>(x->shape()).set_requires_grad(true));
    const auto r = sc::ssd(v[0], v[1], v[2], v[3], v[4], {}, {.resets = olmax::cast<float>(in.resets), .chunk = long(Q)});
    olmax::sum(r.y).backward();
    CHECK(olmax_test::largest_constant(t.graph()) == B * T);  // the resets themselves; the [batch, chunks, Q, Q] masks (B T Q) are made from them in the program
}

TEST_CASE("nn::Mamba2: layer contract, parameters and the reference initialisation", "[ssd][mamba2]") {
    static_assert(nn::assert_layer<nn::Mamba2<float>>());
    static_assert(nn::assert_layer<nn::Mamba2<double>>());
    nn::Config config;
    config.features = 40;  // E = 80: P = gcd(80, 64) = 16, H = 5
    nn::Module<nn::Mamba2<double>> module(config);
    const auto params = module.parameters();
    REQUIRE(params.size() == 8);
    const std::size_t E = 80, H = 5, N = 64, K = 4, width = E + 2 * N;
    CHECK(params[0].name == "mamba2/in_proj/weight");
    CHECK(params[0].tensor.shape() == olmax::Shape{40, E + width + H});
    CHECK(params[1].tensor.shape() == olmax::Shape{K, width});
    CHECK(params[2].tensor.shape() == olmax::Shape{width});
    CHECK(params[3].name == "mamba2/dt_bias");
    CHECK(params[4].name == "mamba2/A_log");
    CHECK(params[5].name == "mamba2/D");
    CHECK(params[6].name == "mamba2/norm/weight");
    CHECK(params[6].role == nn::Role::norm_scale);
    CHECK(params[7].tensor.shape() == olmax::Shape{E, 40});
    for (std::size_t i : {3u, 4u, 5u}) CHECK(params[i].role == nn::Role::other);
    for (std::size_t h = 0; h < H; ++h) {
        const double dt = std::log1p(std::exp(params[3].tensor(h)));  // softplus(dt_bias)
        CHECK(dt >= 1e-3 * (1 - 1e-9));
        CHECK(dt <= 1e-1 * (1 + 1e-9));
        const double a = std::exp(params[4].tensor(h));  // -A
        CHECK(a >= 1 - 1e-12);
        CHECK(a <= 16 + 1e-9);
        CHECK(params[5].tensor(h) == 1.0);
    }
    CHECK(nn::Mamba2Config::default_head_dim(64) == 64);
    CHECK(nn::Mamba2Config::default_head_dim(8) == 16);
    CHECK(nn::Mamba2Config::default_head_dim(3) == 2);
    olmax::Generator rng(1);
    auto x = olmax::randn<double>({2, 7, 40}, rng);
    CHECK(module(x).shape() == x.shape());
}

TEST_CASE("nn::Mamba2: check_layer_gradients (double), one group and two", "[ssd][mamba2][grad]") {
    for (std::size_t groups : {1u, 2u}) {
        olmax::Generator rng(20 + groups);
        nn::Mamba2<double> layer(ssd_small_config(groups), rng);
        INFO("groups " << groups);
        const auto result = olmax::testing::check_layer_gradients(layer, olmax::randn<double>({2, 7, 4}, rng));
        INFO(result);
        CHECK(result.ok);
        CHECK(result.checked > 0);
    }
}

TEST_CASE("nn::Mamba2: gradients (double) of input and parameters with resets, and through the carried state", "[ssd][mamba2][grad]") {
    olmax::Generator rng(21);
    nn::Mamba2<double> layer(ssd_small_config(), rng);
    const Tensor<double> x = olmax::randn<double>({2, 6, 4}, rng);
    Tensor<double> resets({2, 6});
    resets(0, 2) = 1;
    resets(1, 4) = 1;
    {
        auto params = ssd_layer_parameters(layer);
        auto f = [&](const std::vector<Tensor<double>>& in) {
            ssd_bind_parameters(layer, std::vector<Tensor<double>>(in.begin() + 1, in.end()));
            return layer.forward(in[0], resets);
        };
        std::vector<Tensor<double>> inputs{x};
        inputs.insert(inputs.end(), params.begin(), params.end());
        olmax_test::check_gradients(f, inputs);
    }
    const Tensor<double> ssm = olmax::randn<double>({2, 4, 2, 3}, rng), conv = olmax::randn<double>({2, 2, 8 + 2 * 2 * 3}, rng);
    auto g = [&](const std::vector<Tensor<double>>& in) {
        const auto out = layer.forward_with_state(in[0], {in[1], in[2]}, resets);
        return olmax::concat({olmax::reshape(out.y, {out.y.size()}), olmax::reshape(out.state.ssm, {out.state.ssm.size()}),
                              olmax::reshape(out.state.conv, {out.state.conv.size()})},
                             0);
    };
    olmax_test::check_gradients(g, {x, ssm, conv});
}

TEST_CASE("nn::Mamba2: packed documents, pieces with the carried state, causality", "[ssd][mamba2]") {
    olmax::Generator rng(22);
    nn::Mamba2<double> layer(ssd_small_config(), rng);
    const std::size_t first = 5, total = 13;
    const Tensor<double> x = olmax::randn<double>({1, total, 4}, rng);
    Tensor<double> resets({1, total});
    resets(0, first) = 1;
    const auto packed = layer.forward(x, resets);
    const auto one = layer.forward(olmax::slice(x, 1, 0, first));
    const auto two = layer.forward(olmax::slice(x, 1, first, total));
    CHECK(olmax_test::max_abs_diff(packed, olmax::concat({one, two}, 1)) < 1e-12);
    CHECK(olmax_test::max_abs_diff(olmax::slice(layer.forward(x), 1, first, total), two) > 1e-6);

    const Tensor<double> xs = olmax::randn<double>({2, total, 4}, rng);
    Tensor<double> r2({2, total});
    r2(0, 5) = 1;  // inside the first piece, within K-1 of its end: the carried conv inputs must stop there
    r2(1, 7) = 1;
    const auto whole = layer.forward_with_state(xs, {}, r2);
    nn::Mamba2State<double> state;
    std::vector<Tensor<double>> pieces;
    for (auto [begin, end] : {std::pair<std::size_t, std::size_t>{0, 6}, {6, 7}, {7, 13}}) {
        const auto out = layer.forward_with_state(olmax::slice(xs, 1, begin, end), state, olmax::slice(r2, 1, begin, end));
        pieces.push_back(out.y);
        state = out.state;
    }
    CHECK(olmax_test::max_abs_diff(olmax::concat(pieces, 1), whole.y) < 1e-12);
    CHECK(olmax_test::max_abs_diff(state.ssm, whole.state.ssm) < 1e-12);
    CHECK(olmax_test::max_abs_diff(state.conv, whole.state.conv) < 1e-12);

    Tensor<double> changed = x.clone();
    for (std::size_t f = 0; f < 4; ++f) changed(0, 8, f) += 1.0;
    const auto a = layer.forward(x), b = layer.forward(changed);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 0, 8), olmax::slice(b, 1, 0, 8)) == 0);
    CHECK(olmax_test::max_abs_diff(olmax::slice(a, 1, 8, total), olmax::slice(b, 1, 8, total)) > 0);
}

TEST_CASE("nn::Mamba2: traced, with resets, the program computes the eager layer's output", "[ssd][mamba2][trace]") {
    namespace gx = olmax::xla::graph;
    olmax::Generator rng(25);
    nn::Mamba2<float> layer(ssd_small_config(), rng);
    const Tensor<float> x = olmax::randn<float>({2, 8, 4}, rng);
    Tensor<float> resets({2, 8});
    resets(0, 3) = 1;
    resets(1, 6) = 1;
    const Tensor<float> eager = layer.forward(x, resets);
    olmax::trace::tracing t;
    const Tensor<float> tx = t.input<float>(x.shape()), tr = t.input<float>(resets.shape());
    const Tensor<float> y = layer.forward(tx, tr);  // the parameters are the program's constants
    const gx::graph& graph = t.graph();
    REQUIRE(graph.inputs().size() == 2);
    std::vector<gx::host_value> host;
    for (std::size_t k = 0; k < 2; ++k) {
        const Tensor<float>& value = k == 0 ? x : resets;
        host.push_back(gx::host_value{graph.at(graph.inputs()[k]).outputs[0], std::vector<double>(value.begin(), value.end())});
    }
    const auto out = gx::evaluate(graph, host, {olmax::trace::var_of(y)});
    double worst = 0;
    for (std::size_t i = 0; i < eager.size(); ++i) worst = olmax_test::worse(worst, std::abs(out[0].data[i] - double(eager.data()[i])));
    CHECK(worst < 1e-5);  // float eager against the program in double
}

TEST_CASE("nn::Mamba2: float trains through nn::Stack", "[ssd][mamba2]") {
    nn::Config config;
    config.features = 8;  // E = 16: one head of P = 16
    config.seed = 3;
    nn::Stack<nn::Mamba2<float>> stack(config, 2);
    olmax::Generator rng(23);
    auto x = olmax::parameter(olmax::randn<float>({2, 33, 8}, rng));
    auto y = stack.forward(x);
    CHECK(y.shape() == x.shape());
    olmax::sum(olmax::square(y)).backward();
    REQUIRE(x.grad().defined());
    for (float v : x.grad()) REQUIRE(std::isfinite(v));
    for (const auto& p : nn::parameters(stack)) {
        INFO(p.name);
        CHECK(p.tensor.grad().defined());
    }
}

TEST_CASE("nn::Mamba2: bad sizes and inputs throw errors naming the layer", "[ssd][mamba2]") {
    olmax::Generator rng(24);
    using Catch::Matchers::Contains;
    auto config = ssd_small_config();
    config.head_dim = 3;  // does not divide E = 8
    REQUIRE_THROWS_AS(nn::Mamba2<double>(config, rng), olmax::value_error);
    CHECK_THROWS_WITH(nn::Mamba2<double>(config, rng), Contains("nn::Mamba2: the head dim P = 3 does not divide the inner width E = 8"));
    config = ssd_small_config(3);  // 4 heads in 3 groups
    CHECK_THROWS_WITH(nn::Mamba2<double>(config, rng), Contains("nn::Mamba2") && Contains("3 groups"));
    config = ssd_small_config();
    config.state = 0;
    CHECK_THROWS_AS(nn::Mamba2<double>(config, rng), olmax::value_error);
    CHECK_THROWS_WITH(nn::Mamba2<double>(nn::Config{}, rng), Contains("nn::Mamba2"));
    nn::Mamba2<double> layer(ssd_small_config(), rng);
    REQUIRE_THROWS_AS(layer.forward(Tensor<double>({1, 4, 5})), olmax::shape_error);
    CHECK_THROWS_WITH(layer.forward(Tensor<double>({1, 4, 5})), Contains("nn::Mamba2: expected input [batch, T, 4]"));
    CHECK_THROWS_AS(layer.forward(Tensor<double>({4, 4})), olmax::shape_error);
    CHECK_THROWS_AS(layer.forward(Tensor<double>({1, 0, 4})), olmax::value_error);
    CHECK_THROWS_WITH(layer.forward(Tensor<double>({2, 4, 4}), Tensor<double>({2, 5})), Contains("nn::Mamba2: resets of shape [2, 5]"));
    CHECK_THROWS_WITH(layer.forward_with_state(Tensor<double>({2, 4, 4}), {Tensor<double>({2, 4, 2, 2}), {}}),
                      Contains("nn::Mamba2: SSD state of shape [2, 4, 2, 2]"));
    CHECK_THROWS_WITH(layer.forward_with_state(Tensor<double>({2, 4, 4}), {{}, Tensor<double>({2, 2, 8})}),
                      Contains("nn::Mamba2: conv state of shape [2, 2, 8]"));
}
