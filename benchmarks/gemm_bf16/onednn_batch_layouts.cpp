// How oneDNN (2.x or 3.x) serves the byte LM's small bf16 products one call at a time against one call for
// a batch, for the layouts behind the choices in olmax (issue 13, benchmarks/RESULTS.md):
// - onednn::gemm_batched_bf16 batches only layouts whose items are dense (the mixer's products, a
//   convolution's unshifted tap); for a shifted tap (items with gaps) oneDNN picks other kernels;
// - under the bf16 policy a small convolution's weight gradient is one GEMM on the unfolded input
//   instead of one per (tap, batch element) (ops/conv.hpp, `unfolded_dw_elements`), and so is its
//   forward (`unfolded_forward_elements`); its dx stays per tap (the last lines: the unfolded forms
//   of dx measured, the copies they need timed).
// oneDNN alone, no olmax, so the figures are the library's. Not built by CMake (a measurement, not
// a tool); build and run with
//     g++ -O2 -std=c++20 benchmarks/gemm_bf16/onednn_batch_layouts.cpp -ldnnl -o /tmp/onednn_batch_layouts
//     OMP_NUM_THREADS=1 /tmp/onednn_batch_layouts [T]
// (T: the sequence length, 64 by default; the model's deep-long row has 256). Prints the best of 30 repetitions of 10 calls each, in microseconds.

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

namespace {

using dims = dnnl::memory::dims;
using dnnl::memory;

const auto bf16 = memory::data_type::bf16;
const auto f32 = memory::data_type::f32;

/// A matmul with its memory objects (pointers set by the caller).
struct Product {
    dnnl::matmul primitive;
    memory a, b, c;
    std::string impl;
};

Product make(const dnnl::engine& engine, const memory::desc& a, const memory::desc& b, const memory::desc& c, float beta) {
    dnnl::primitive_attr attr;
    if (beta != 0.0f) {
        dnnl::post_ops ops;
        ops.append_sum(beta);
        attr.set_post_ops(ops);
    }
#if DNNL_VERSION_MAJOR >= 3  // 3.0 dropped the operation descriptor
    const dnnl::matmul::primitive_desc pd(engine, a, b, c, attr);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine);
#endif
    return {dnnl::matmul(pd), memory(a, engine, nullptr), memory(b, engine, nullptr), memory(c, engine, nullptr), pd.impl_info_str()};
}

void run(dnnl::stream& stream, Product& p, const void* a, const void* b, float* c) {
    p.a.set_data_handle(const_cast<void*>(a));
    p.b.set_data_handle(const_cast<void*>(b));
    p.c.set_data_handle(c);
    p.primitive.execute(stream, {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
}

template <class F>
double best_us(dnnl::stream& stream, F&& f) {
    double best = 1e30;
    for (int r = 0; r < 30; ++r) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) f();
        stream.wait();
        best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / 10);
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const long B = 8, T = argc > 1 ? std::atol(argv[1]) : 64, taps = 5;  // T: the sequence length (argument; 64 by default)
    std::vector<std::uint16_t> x(B * T * 128 * taps, 0x3f80), w(128 * 128 * taps, 0x3f80);  // bf16 ones
    std::vector<float> y(B * T * 128 * taps);

    // A convolution tap: out[b, s:T] += x[b, 0:T-s] w for the 8 batch elements (shared weight).
    for (const auto& [cin, cout, shift] : {std::tuple{64L, 128L, 0L}, std::tuple{64L, 128L, 3L}, std::tuple{128L, 64L, 2L}}) {
        const long m = T - shift;
        Product one = make(engine, memory::desc({m, cin}, bf16, dims{cin, 1}), memory::desc({cin, cout}, bf16, dims{cout, 1}),
                           memory::desc({m, cout}, f32, dims{cout, 1}), 1.0f);
        Product batch = make(engine, memory::desc({B, m, cin}, bf16, dims{T * cin, cin, 1}), memory::desc({1, cin, cout}, bf16, dims{cin * cout, cout, 1}),
                             memory::desc({B, m, cout}, f32, dims{T * cout, cout, 1}), 1.0f);
        const double items = best_us(stream, [&] {
            for (long b = 0; b < B; ++b) run(stream, one, x.data() + b * T * cin, w.data(), y.data() + (b * T + shift) * cout);
        });
        const double batched = best_us(stream, [&] { run(stream, batch, x.data(), w.data(), y.data() + shift * cout); });
        std::printf("conv tap  Cin %3ld Cout %3ld shift %ld: 8 calls (%s) %6.1f us, one call (%s) %6.1f us: %.2fx\n", cin, cout, shift,
                    one.impl.c_str(), items, batch.impl.c_str(), batched, items / batched);
    }

    // The mixer: y_g = w^T x_g for 32 groups, x_g [16, 64], w [16, 16] shared (transposed).
    {
        const long G = 32, K = 16, N = 64;
        Product one = make(engine, memory::desc({K, K}, bf16, dims{1, K}), memory::desc({K, N}, bf16, dims{N, 1}),
                           memory::desc({K, N}, f32, dims{N, 1}), 0.0f);
        Product batch = make(engine, memory::desc({1, K, K}, bf16, dims{K * K, 1, K}), memory::desc({G, K, N}, bf16, dims{K * N, N, 1}),
                             memory::desc({G, K, N}, f32, dims{K * N, N, 1}), 0.0f);
        const double items = best_us(stream, [&] {
            for (long g = 0; g < G; ++g) run(stream, one, w.data(), x.data() + g * K * N, y.data() + g * K * N);
        });
        const double batched = best_us(stream, [&] { run(stream, batch, w.data(), x.data(), y.data()); });
        std::printf("mixer     32 x [16 x 16] x [16 x 64]:   32 calls %6.1f us, one call (%s) %6.1f us: %.2fx\n", items, batch.impl.c_str(),
                    batched, items / batched);
    }

    // A convolution's dw (Cin 64, Cout 128): per (tap, batch element) dw_k += x[b, 0:T-s]^T dy[b, s:T],
    // against one GEMM unfold(x)^T dy with unfold(x) [B T, K Cin] (the unfolding copy not timed).
    {
        const long cin = 64, cout = 128;
        std::vector<Product> per_tap;
        for (long s = 0; s < taps; ++s)
            per_tap.push_back(make(engine, memory::desc({cin, T - s}, bf16, dims{1, cin}), memory::desc({T - s, cout}, bf16, dims{cout, 1}),
                                   memory::desc({cin, cout}, f32, dims{cout, 1}), 1.0f));
        Product unfolded = make(engine, memory::desc({taps * cin, B * T}, bf16, dims{1, taps * cin}), memory::desc({B * T, cout}, bf16, dims{cout, 1}),
                                memory::desc({taps * cin, cout}, f32, dims{cout, 1}), 0.0f);
        const double items = best_us(stream, [&] {
            for (long s = 0; s < taps; ++s)
                for (long b = 0; b < B; ++b)
                    run(stream, per_tap[s], x.data() + b * T * cin, w.data() + (b * T + s) * cout, y.data() + (taps - 1 - s) * cin * cout);
        });
        const double once = best_us(stream, [&] { run(stream, unfolded, x.data(), w.data(), y.data()); });
        std::printf("conv dw   Cin 64 Cout 128, 5 taps:      40 calls %6.1f us, one GEMM on the unfolded input %6.1f us: %.2fx\n", items, once,
                    items / once);
    }

    // A whole convolution's forward and dx, (Cin, Cout) = (64, 128) and (128, 64), 5 taps: per tap
    // (the unshifted tap one batched call, each shifted tap one call per batch element) against one
    // GEMM over [B T, K Cin] on the unfolded input (forward; the unfolding copy timed) and one GEMM
    // dU [B T, K Cin] = dy w^T followed by the fold dx[b, t] = sum_k dU[b, t + s_k, k] (dx; timed).
    // unfolded[(b, t), (k, c)] = source[b, t -+ s_k, c] (0 outside [0, T)), s_k = taps-1-k: backwards in
    // time for the forward's input, forwards for dx's output gradient.
    auto unfold = [&](const std::uint16_t* source, long channels, bool forwards, std::uint16_t* unfolded) {
        for (long r = 0; r < B * T; ++r)
            for (long k = 0; k < taps; ++k) {
                const long s = taps - 1 - k, t = r % T;
                std::uint16_t* out = unfolded + (r * taps + k) * channels;
                if (forwards ? t + s < T : t >= s) std::copy_n(source + (forwards ? r + s : r - s) * channels, channels, out);
                else std::fill_n(out, channels, std::uint16_t{0});
            }
    };
    for (const auto& [cin, cout] : {std::tuple{64L, 128L}, std::tuple{128L, 64L}}) {
        std::vector<std::uint16_t> unfolded(B * T * taps * cin);
        std::vector<float> du(B * T * taps * cin), dx(B * T * cin);
        Product tap0 = make(engine, memory::desc({B, T, cin}, bf16, dims{T * cin, cin, 1}), memory::desc({1, cin, cout}, bf16, dims{cin * cout, cout, 1}),
                            memory::desc({B, T, cout}, f32, dims{T * cout, cout, 1}), 0.0f);
        Product dtap0 = make(engine, memory::desc({B, T, cout}, bf16, dims{T * cout, cout, 1}), memory::desc({1, cout, cin}, bf16, dims{cin * cout, 1, cout}),
                             memory::desc({B, T, cin}, f32, dims{T * cin, cin, 1}), 0.0f);
        std::vector<Product> shifted, dshifted;
        for (long s = 1; s < taps; ++s) {
            shifted.push_back(make(engine, memory::desc({T - s, cin}, bf16, dims{cin, 1}), memory::desc({cin, cout}, bf16, dims{cout, 1}),
                                   memory::desc({T - s, cout}, f32, dims{cout, 1}), 1.0f));
            dshifted.push_back(make(engine, memory::desc({T - s, cout}, bf16, dims{cout, 1}), memory::desc({cout, cin}, bf16, dims{1, cout}),
                                    memory::desc({T - s, cin}, f32, dims{cin, 1}), 1.0f));
        }
        Product forward_once = make(engine, memory::desc({B * T, taps * cin}, bf16, dims{taps * cin, 1}),
                                    memory::desc({taps * cin, cout}, bf16, dims{cout, 1}), memory::desc({B * T, cout}, f32, dims{cout, 1}), 0.0f);
        Product dx_once = make(engine, memory::desc({B * T, cout}, bf16, dims{cout, 1}), memory::desc({cout, taps * cin}, bf16, dims{1, cout}),
                               memory::desc({B * T, taps * cin}, f32, dims{taps * cin, 1}), 0.0f);
        const double forward_taps = best_us(stream, [&] {
            run(stream, tap0, x.data(), w.data() + (taps - 1) * cin * cout, y.data());
            for (long s = 1; s < taps; ++s)
                for (long b = 0; b < B; ++b)
                    run(stream, shifted[s - 1], x.data() + b * T * cin, w.data() + (taps - 1 - s) * cin * cout, y.data() + (b * T + s) * cout);
        });
        const double forward_unfolded = best_us(stream, [&] {
            unfold(x.data(), cin, false, unfolded.data());
            run(stream, forward_once, unfolded.data(), w.data(), y.data());
        });
        const double dx_taps = best_us(stream, [&] {
            run(stream, dtap0, x.data(), w.data() + (taps - 1) * cin * cout, dx.data());
            for (long s = 1; s < taps; ++s)
                for (long b = 0; b < B; ++b)
                    run(stream, dshifted[s - 1], x.data() + (b * T + s) * cout, w.data() + (taps - 1 - s) * cin * cout, dx.data() + b * T * cin);
        });
        const double dx_folded = best_us(stream, [&] {
            run(stream, dx_once, x.data(), w.data(), du.data());
            for (long r = 0; r < B * T; ++r) {
                const long t = r % T;
                float* out = dx.data() + r * cin;
                std::copy_n(du.data() + (r * taps + taps - 1) * cin, cin, out);
                for (long s = 1; s < taps && t + s < T; ++s) {
                    const float* in = du.data() + ((r + s) * taps + taps - 1 - s) * cin;
                    for (long c = 0; c < cin; ++c) out[c] += in[c];
                }
            }
        });
        // dx as one GEMM on dy unfolded forwards in time: dx[b, t] = [dy[b, t + s_k]]_k [w_k^T]_k, the
        // weight rearranged to [K Cout, Cin] (both copies timed).
        std::vector<std::uint16_t> dy_unfolded(B * T * taps * cout);
        Product dx_future = make(engine, memory::desc({B * T, taps * cout}, bf16, dims{taps * cout, 1}),
                                 memory::desc({taps * cout, cin}, bf16, dims{cin, 1}), memory::desc({B * T, cin}, f32, dims{cin, 1}), 0.0f);
        std::vector<std::uint16_t> stacked(taps * cout * cin);
        const double dx_unfolded = best_us(stream, [&] {
            for (long k = 0; k < taps; ++k)
                for (long c = 0; c < cin; ++c)
                    for (long o = 0; o < cout; ++o) stacked[(k * cout + o) * cin + c] = w[(k * cin + c) * cout + o];
            unfold(x.data(), cout, true, dy_unfolded.data());
            run(stream, dx_future, dy_unfolded.data(), stacked.data(), dx.data());
        });
        std::printf("conv Cin %3ld Cout %3ld, 5 taps: forward 33 calls %6.1f us, unfolded (copy + 1 call) %6.1f us: %.2fx; "
                    "dx 33 calls %6.1f us, 1 call + fold %6.1f us: %.2fx  [%s | %s]\n",
                    cin, cout, forward_taps, forward_unfolded, forward_taps / forward_unfolded, dx_taps, dx_folded, dx_taps / dx_folded,
                    forward_once.impl.c_str(), dx_once.impl.c_str());
        std::printf("  dx on dy unfolded forwards (copy + 1 call) %6.1f us: %.2fx [%s]\n", dx_unfolded, dx_taps / dx_unfolded, dx_future.impl.c_str());
    }
}
