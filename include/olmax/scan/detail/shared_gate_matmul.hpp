#pragma once
// chunked_matmul with gates shared by heads of P channels (gates [B, T, H], C = H P, Mamba-2
// style), in place: one real GEMM per head and chunk through the device's GEMM (its bf16 product
// for bfloat16 storage: the matrix-unit form). Forward only: the backward of
// shared gates runs on the tile engine (see the dispatch table, dispatch.hpp).

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "olmax/core/bfloat16.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/scan/detail/denormals.hpp"
#include "olmax/scan/detail/problem.hpp"

namespace olmax::scan::detail {

/// Within a chunk of Q steps of one head: H = M X + p carry^T with the Q x Q decay matrix M
/// (lower-triangular forward, upper-triangular reverse; entries are products of the head's gates
/// built by row-wise cumulative products) multiplying the chunk's [Q x P] inputs with one GEMM
/// of the current device. Reads x and writes h in place (btc: rows of ld C; bct: the transposed
/// product with ld T). float and double compute in the storage type (Acc = T). bfloat16 storage
/// is the matrix-unit form: M (built in float) is rounded to bfloat16 and multiplied with the
/// stored inputs as they are by the device's bf16 x bf16 -> fp32 product (Kernels::gemm_bf16: on
/// the CPU's bf16 units inside a bf16_matmul_scope given oneDNN's), into a float chunk that takes
/// the float carry term and is rounded once into h. Rounding M adds at most 2^-8 of the sum of
/// |M||x| to each output (docs/BF16.md, "Scans in bf16 storage").
template <bool Log, class Acc, class T>
void shared_matmul_forward_impl(const Geometry& g, const ForwardArgs<T>& args, std::size_t Q) {
    constexpr bool bf16 = std::is_same_v<T, bfloat16>;
    static_assert(bf16 || std::is_same_v<Acc, T>, "shared_gate_matmul: float and double compute in their storage type");
    const std::size_t H = g.gate_channels, P = g.share, T_ = g.time;
    const bool btc = g.layout == Layout::btc;
    backend::current().parallel_for(g.batch * H, T_ * P * Q, [&](std::size_t begin, std::size_t end) {
        denormal_guard guard;
        Storage<Acc> M(Q * Q), decay(Q), gate(Q);
        Storage<Acc> carry(P);
        Storage<bfloat16> rounded_M(bf16 ? Q * Q : 0);
        Storage<Acc> chunk_out(bf16 ? Q * P : 0);  // bf16: the chunk's h in float, [len, P] (btc) or [P, len] (bct)
        for (std::size_t task = begin; task < end; ++task) {
            const std::size_t b = task / H, head = task % H, c0 = head * P;
            for (std::size_t p = 0; p < P; ++p) carry[p] = args.h0 ? Acc(args.h0[b * g.channels + c0 + p]) : Acc(0);
            const std::size_t chunks = (T_ + Q - 1) / Q;
            for (std::size_t n = 0; n < chunks; ++n) {
                // Chunks in processing order; t0 = first time index of the chunk in memory.
                const std::size_t len = std::min(Q, T_ - n * Q);
                const std::size_t t0 = g.reverse ? T_ - n * Q - len : n * Q;
                for (std::size_t i = 0; i < len; ++i) gate[i] = load_gate<Log, Acc>(args.gates[g.gate_index(b, t0 + i, c0)]);
                std::fill(M.begin(), M.begin() + std::ptrdiff_t(len * len), Acc(0));
                if (!g.reverse) {
                    for (std::size_t i = 0; i < len; ++i) {
                        Acc* row = M.data() + i * len;
                        const Acc* above = i > 0 ? row - len : row;
                        for (std::size_t j = 0; i > 0 && j < i; ++j) row[j] = above[j] * gate[i];
                        row[i] = 1;
                        decay[i] = i == 0 ? gate[0] : decay[i - 1] * gate[i];
                    }
                } else {
                    for (std::size_t i = len; i-- > 0;) {
                        Acc* row = M.data() + i * len;
                        for (std::size_t j = i + 1; j < len; ++j) row[j] = row[j + len] * gate[i];
                        row[i] = 1;
                        decay[i] = i + 1 == len ? gate[i] : gate[i] * decay[i + 1];
                    }
                }
                const std::size_t xoff = g.x_index(b, t0, c0);
                const std::size_t last = g.reverse ? 0 : len - 1;  // the chunk's last step in processing order
                // The GEMM writes the chunk's h without the carry term into `out` [len, P] (btc) or
                // [P, len] (bct) with leading dimension ld_out: h itself for float and double, a float
                // chunk for bf16 storage, which is rounded into h once the carry term is in.
                Acc* out;
                std::size_t ld_out;
                if constexpr (bf16) {
                    to_bfloat16(M.data(), rounded_M.data(), len * len);
                    out = chunk_out.data();
                    ld_out = btc ? P : len;
                    if (btc) backend::current().gemm_bf16(false, false, len, P, len, 1.0f, rounded_M.data(), len, args.x + xoff, g.channels, 0.0f, out, ld_out);
                    else backend::current().gemm_bf16(false, true, P, len, len, 1.0f, args.x + xoff, T_, rounded_M.data(), len, 0.0f, out, ld_out);
                } else {
                    out = args.h + xoff;
                    ld_out = btc ? g.channels : T_;
                    if (btc) backend::current().gemm(false, false, len, P, len, T(1), M.data(), len, args.x + xoff, g.channels, T(0), out, ld_out);
                    else backend::current().gemm(false, true, P, len, len, T(1), args.x + xoff, T_, M.data(), len, T(0), out, ld_out);
                }
                // Add the carry term (and round into h) along the contiguous axis of both.
                if (btc) {
                    for (std::size_t i = 0; i < len; ++i) {
                        Acc* o = out + i * ld_out;
                        [[maybe_unused]] T* hr = args.h + xoff + i * g.channels;
                        const Acc d = decay[i];
#pragma omp simd
                        for (std::size_t p = 0; p < P; ++p) {
                            o[p] += d * carry[p];
                            if constexpr (bf16) store_value(hr[p], o[p]);
                        }
                    }
                    for (std::size_t p = 0; p < P; ++p) carry[p] = out[last * ld_out + p];
                } else {
                    for (std::size_t p = 0; p < P; ++p) {
                        Acc* o = out + p * ld_out;
                        [[maybe_unused]] T* hr = args.h + xoff + p * T_;
                        const Acc c = carry[p];
#pragma omp simd
                        for (std::size_t i = 0; i < len; ++i) {
                            o[i] += decay[i] * c;
                            if constexpr (bf16) store_value(hr[i], o[i]);
                        }
                        carry[p] = o[last];
                    }
                }
            }
            if (args.h_last)
                for (std::size_t p = 0; p < P; ++p) store_value(args.h_last[b * g.channels + c0 + p], carry[p]);
        }
    });
}

/// The shared-gate GEMM form as a kernel family of the dispatch table (dispatch.hpp): gates shared
/// by heads (share > 1), forward only.
struct shared_gate_matmul_family {
    static constexpr std::string_view name = "shared_gate_matmul";
    template <class Acc, class T>
    static void forward(const Geometry& g, const ForwardArgs<T>& args, std::size_t chunk) {
        if (g.log_gates) shared_matmul_forward_impl<true, Acc>(g, args, chunk);
        else shared_matmul_forward_impl<false, Acc>(g, args, chunk);
    }
};

}  // namespace olmax::scan::detail
