#pragma once
// GEMM through oneDNN (Intel's oneAPI Deep Neural Network Library, 2.x or 3.x): bf16 x bf16 -> fp32 on
// the CPU's bf16 units (AVX512-BF16, AMX) and fp32 x fp32. Needs the CMake target olmax::onednn
// (Debian 12's libdnnl-dev is oneDNN 2.6; tools/setup_onednn3.sh fetches a 3.x build;
// cmake/olmaxOneDnn.cmake); the rest of olmax does not, and olmax/backend/bf16_gemm.hpp is the
// portable bf16 product every build has. The two API generations differ only in how a matmul is
// described and scaled (`matmul_descriptor` below).
//
// Which path a bf16 product takes, decided once per process from oneDNN's effective ISA:
// - the CPU has avx512_core_bf16 or amx: a cached oneDNN bf16 matmul primitive per shape;
// - otherwise (AVX2 machines, or a shape oneDNN has no bf16 kernel for): both operands widened to
//   fp32 and one oneDNN fp32 matmul, with a one-time notice that bf16 is not accelerated here.
// oneDNN's reference kernels (correct, very slow) are never used: a primitive whose implementation
// is "ref" counts as unavailable.
//
// Threads: oneDNN's OpenMP runtime, capped at the current kernels' thread count (cpu_openmp follows
// OMP_NUM_THREADS / omp_set_num_threads; cpu_serial is 1), and 1 when called inside an olmax
// parallel loop or an OpenMP region, so nested calls do not oversubscribe. Primitives are cached per
// (types, transposes, sizes, leading dimensions, alpha, beta, threads) and are safe to call from
// several threads at once (each thread binds its own memory objects and scratchpad to them).

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "olmax/backend/bf16_gemm.hpp"
#include "olmax/backend/cpu_features.hpp"
#include "olmax/backend/cpu_serial.hpp"
#include "olmax/backend/detail/thread_pool.hpp"
#include "olmax/backend/dispatch.hpp"
#include "olmax/core/bfloat16.hpp"
#include "olmax/core/tensor.hpp"

namespace olmax::backend::onednn {

namespace shared = olmax::backend::detail;  // the portable path's helpers (bf16_gemm.hpp) and the backend's internals

/// What oneDNN does with bf16 on this CPU.
struct Bf16Support {
    bool accelerated = false;  // bf16 matmuls run on bf16 units (avx512_core_bf16 or amx)
    std::string isa;           // oneDNN's effective ISA, e.g. "avx2", "avx512_core_amx"
};

namespace detail {

/// The most capable of these ISAs that `isa` includes. oneDNN's ISA values are nested bit masks in
/// 2.x and 3.x alike; ISAs only one generation names (3.x's avx512_core_amx_fp16, say) are reported
/// as the nearest of these.
inline std::string_view isa_name(dnnl::cpu_isa isa) {
    using dnnl::cpu_isa;
    static constexpr std::pair<cpu_isa, std::string_view> known[] = {
        {cpu_isa::avx512_core_amx, "avx512_core_amx"}, {cpu_isa::avx512_core_bf16, "avx512_core_bf16"},
        {cpu_isa::avx512_core_vnni, "avx512_core_vnni"}, {cpu_isa::avx512_core, "avx512_core"}, {cpu_isa::avx2_vnni, "avx2_vnni"},
        {cpu_isa::avx2, "avx2"}, {cpu_isa::avx, "avx"}, {cpu_isa::sse41, "sse41"}};
    const auto bits = static_cast<unsigned>(isa);
    for (const auto& [candidate, name] : known)
        if (const auto need = static_cast<unsigned>(candidate); (bits & need) == need) return name;
    return "unknown";
}

inline const dnnl::engine& engine() {
    static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

/// One cached product: the primitive and its scratchpad size, or `available == false` when oneDNN
/// has no (non-reference) kernel for it.
struct Entry {
    bool available = false;
    std::string impl;
    std::unique_ptr<dnnl::matmul> primitive;
    dnnl::memory::desc a, b, c, scratchpad;
};

/// What a cached product is: types, transposes, sizes, leading dimensions, scales and threads;
/// `count` > 1 for `count` products in one call, item i at element offsets i * stride (stride 0:
/// one operand shared by every item).
struct Key {
    int type = 0;
    bool trans_a = false, trans_b = false;
    std::size_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
    float alpha = 1.0f, beta = 0.0f;
    int threads = 1;
    std::size_t count = 1, stride_a = 0, stride_b = 0, stride_c = 0;
    bool operator==(const Key&) const = default;
};
struct KeyHash {
    std::size_t operator()(const Key& key) const noexcept {
        std::size_t h = 0;
        auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };  // boost-style hash_combine
        mix(std::size_t(key.type) << 2 | std::size_t(key.trans_a) << 1 | std::size_t(key.trans_b));
        for (std::size_t v : {key.m, key.n, key.k, key.lda, key.ldb, key.ldc, key.count, key.stride_a, key.stride_b, key.stride_c}) mix(v);
        mix(std::hash<float>{}(key.alpha));
        mix(std::hash<float>{}(key.beta));
        mix(std::size_t(key.threads));
        return h;
    }
};

struct Cache {
    std::mutex mutex;
    std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> entries;
};
inline Cache& cache() {
    static Cache c;
    return c;
}

/// Shapes beyond this many cached products start a fresh cache (a model has a few dozen).
inline constexpr std::size_t max_cached = 4096;

/// A rows x cols matrix with leading dimension ld (transposed: element (i, j) at j * ld + i); with
/// count > 1 a batch of them, item i at i * stride (stride 0: one matrix broadcast to every item).
inline dnnl::memory::desc matrix(std::size_t rows, std::size_t cols, bool transposed, std::size_t ld, dnnl::memory::data_type type,
                                 std::size_t count = 1, std::size_t stride = 0) {
    using dims = dnnl::memory::dims;
    const auto r = dnnl::memory::dim(rows), c = dnnl::memory::dim(cols), l = dnnl::memory::dim(ld);
    const dims inner = transposed ? dims{1, l} : dims{l, 1};
    if (count <= 1) return dnnl::memory::desc(dims{r, c}, type, inner);
    // A broadcast operand is a batch of one; its batch stride is then never stepped.
    const auto items = dnnl::memory::dim(stride == 0 ? 1 : count), step = dnnl::memory::dim(stride == 0 ? rows * cols : stride);
    return dnnl::memory::desc(dims{items, r, c}, type, dims{step, inner[0], inner[1]});
}

/// The matmul C = alpha A B + beta C (user scratchpad) in either API generation. oneDNN 2.x scales
/// the product by an output scale; 3.0 removed output scales (its scales are per argument and
/// passed at run time), so there alpha is a linear post-op (alpha x + 0) applied before the sum
/// post-op adds beta C: the same result, one fused epilogue, no extra run-time argument.
inline dnnl::matmul::primitive_desc matmul_descriptor(const dnnl::memory::desc& a, const dnnl::memory::desc& b, const dnnl::memory::desc& c,
                                                      float alpha, float beta) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::post_ops ops;
#if DNNL_VERSION_MAJOR >= 3
    if (alpha != 1.0f) ops.append_eltwise(dnnl::algorithm::eltwise_linear, alpha, 0.0f);
#else
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
#endif
    if (beta != 0.0f) ops.append_sum(beta);
    attr.set_post_ops(ops);
#if DNNL_VERSION_MAJOR >= 3
    return dnnl::matmul::primitive_desc(engine(), a, b, c, attr);
#else
    return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
#endif
}

inline std::shared_ptr<const Entry> make_entry(const Key& key) {
    const auto type = static_cast<dnnl::memory::data_type>(key.type);
    auto e = std::make_shared<Entry>();
    e->a = matrix(key.m, key.k, key.trans_a, key.lda, type, key.count, key.stride_a);
    e->b = matrix(key.k, key.n, key.trans_b, key.ldb, type, key.count, key.stride_b);
    e->c = matrix(key.m, key.n, false, key.ldc, dnnl::memory::data_type::f32, key.count, key.stride_c);
    try {
        const dnnl::matmul::primitive_desc pd = matmul_descriptor(e->a, e->b, e->c, key.alpha, key.beta);
        e->impl = pd.impl_info_str();
        if (e->impl.rfind("ref", 0) == 0) return e;  // reference kernels: unavailable, not slow
        // A batch only where the batch-reduce kernels take it (each item's matrices dense): oneDNN
        // 2.6 serves other strides with its "gemm:jit" kernels, which ran a convolution tap's 8
        // items 0.74-0.84x as fast as 8 calls to the brgemm kernels (AMD EPYC Zen 4, 2026-11-24;
        // benchmarks/gemm_bf16/onednn_batch_layouts.cpp).
        if (key.count > 1 && e->impl.rfind("brg", 0) != 0) return e;
        e->scratchpad = pd.scratchpad_desc();
        e->primitive = std::make_unique<dnnl::matmul>(pd);
        e->available = true;
    } catch (const dnnl::error&) {
        // no implementation for these types on this CPU (dnnl_unimplemented): unavailable
    }
    return e;
}

/// The cached product for this key (created on first use).
inline std::shared_ptr<const Entry> entry(const Key& key) {
    auto& c = cache();
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        if (auto it = c.entries.find(key); it != c.entries.end()) return it->second;
    }
    auto made = make_entry(key);  // outside the lock: can take milliseconds
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.entries.size() >= max_cached) c.entries.clear();
    return c.entries.emplace(key, std::move(made)).first->second;
}

/// This thread's ready-to-run form of a cached product: its memory objects and argument map are
/// made once and re-pointed at the caller's buffers on every call. Making them per call (four
/// dnnl::memory objects and the argument map's hash table) cost as much as the GEMM kernel itself
/// at the byte LM's 64-wide shapes. Holding the entry keeps its descriptors alive after the
/// shared cache drops it.
struct Prepared {
    std::shared_ptr<const Entry> entry;
    dnnl::memory a, b, c, scratchpad;
    std::unordered_map<int, dnnl::memory> args;
};

inline Prepared& prepared(const Key& key) {
    thread_local std::unordered_map<Key, Prepared, KeyHash> mine;
    if (auto it = mine.find(key); it != mine.end()) return it->second;
    if (mine.size() >= max_cached) mine.clear();
    Prepared p;
    p.entry = entry(key);
    if (p.entry->available) {
        p.a = dnnl::memory(p.entry->a, engine(), DNNL_MEMORY_NONE);
        p.b = dnnl::memory(p.entry->b, engine(), DNNL_MEMORY_NONE);
        p.c = dnnl::memory(p.entry->c, engine(), DNNL_MEMORY_NONE);
        p.scratchpad = dnnl::memory(p.entry->scratchpad, engine(), DNNL_MEMORY_NONE);
        p.args = {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}, {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
    }
    return mine.emplace(key, std::move(p)).first->second;
}

/// The key of one product; its thread count is the caller's to set (`run` sets it per call).
inline Key product_key(dnnl::memory::data_type type, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, std::size_t lda,
                       std::size_t ldb, std::size_t ldc, float alpha, float beta) {
    Key key;
    key.type = int(type);
    key.trans_a = trans_a;
    key.trans_b = trans_b;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.alpha = alpha;
    key.beta = beta;
    return key;
}

/// Runs this thread's prepared product on the caller's pointers, with a scratchpad of its own.
inline void execute(Prepared& p, const void* a, const void* b, float* c) {
    thread_local std::unique_ptr<dnnl::stream> stream;
    thread_local std::vector<std::byte> scratch;
    if (!stream) stream = std::make_unique<dnnl::stream>(engine());
    if (scratch.size() < p.entry->scratchpad.get_size()) scratch.resize(p.entry->scratchpad.get_size());
    p.a.set_data_handle(const_cast<void*>(a));
    p.b.set_data_handle(const_cast<void*>(b));
    p.c.set_data_handle(c);
    p.scratchpad.set_data_handle(scratch.data());
    p.entry->primitive->execute(*stream, p.args);
    stream->wait();
}

/// OpenMP threads for oneDNN (see the file comment).
inline int threads_for_call() {
    bool nested = shared::this_thread_region().threads != 0;  // inside an olmax parallel loop
#if defined(_OPENMP)
    nested = nested || omp_in_parallel();
#endif
    return nested ? 1 : std::max(1, current().num_threads());
}

/// Runs the product `key` names on the caller's pointers with this call's OpenMP threads (OpenMP
/// capped to them meanwhile); false, computing nothing, where oneDNN has no kernel for it.
inline bool run(Key key, const void* a, const void* b, float* c) {
    key.threads = threads_for_call();
    shared::omp_thread_cap cap(key.threads);
    Prepared& p = prepared(key);
    if (!p.entry->available) return false;
    execute(p, a, b, c);
    return true;
}

/// C = beta C for the sizes oneDNN does not take (m, n or k zero); true when nothing is left to do.
inline bool trivial(std::size_t m, std::size_t n, std::size_t k, float beta, float* c, std::size_t ldc) {
    if (m == 0 || n == 0) return true;
    if (k != 0) return false;
    for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return true;
}

}  // namespace detail

/// oneDNN's view of this CPU (read once; ONEDNN_MAX_CPU_ISA lowers it).
inline const Bf16Support& bf16_support() {
    static const Bf16Support support = [] {
        const auto isa = dnnl::get_effective_cpu_isa();
        const auto bits = static_cast<unsigned>(isa), bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
        return Bf16Support{(bits & bf16) == bf16, std::string(detail::isa_name(isa))};
    }();
    return support;
}

/// The oneDNN library this process runs (not the headers it was built with), e.g. "2.6.3".
inline std::string version() {
    const auto* v = dnnl::version();
    return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
}

/// What gemm_bf16 runs on, for reports: "onednn 2.6.3 avx512_core_bf16", or "onednn 2.6.3 avx2
/// (fp32: no bf16 units)" on CPUs without them.
inline std::string bf16_gemm_description() {
    const Bf16Support& support = bf16_support();
    return "onednn " + version() + " " + support.isa + (support.accelerated ? "" : " (fp32: no bf16 units)");
}

/// Row-major fp32 C = alpha op(A) op(B) + beta C through oneDNN's matmul (cached per shape);
/// Eigen (cpu_serial) when oneDNN has no kernel for it.
inline void gemm(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a, std::size_t lda,
                 const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    shared::check_gemm_layout("onednn::gemm", trans_a, trans_b, m, n, k, lda, ldb, ldc);
    if (detail::trivial(m, n, k, beta, c, ldc)) return;
    if (!detail::run(detail::product_key(dnnl::memory::data_type::f32, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta), a, b, c))
        cpu_serial::gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Row-major C (fp32) = alpha op(A) op(B) + beta C with A and B bfloat16: on the CPU's bf16 units
/// when it has them, else in fp32 (see the file comment; the fallback says so once).
inline void gemm_bf16(bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha, const bfloat16* a,
                      std::size_t lda, const bfloat16* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    shared::check_gemm_layout("onednn::gemm_bf16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
    if (detail::trivial(m, n, k, beta, c, ldc)) return;
    const Bf16Support& support = bf16_support();
    if (support.accelerated) {
        if (detail::run(detail::product_key(dnnl::memory::data_type::bf16, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta), a, b, c))
            return;
        shared::bf16_notice("onednn-shape", "olmax: oneDNN has no bf16 matmul kernel for some shapes (first: " + std::to_string(m) + "x" +
                                                std::to_string(k) + " by " + std::to_string(k) + "x" + std::to_string(n) +
                                                "); those compute in fp32");
    } else {
        shared::bf16_notice("onednn-isa", "olmax: this CPU has no bf16 matrix instructions (oneDNN ISA " + support.isa +
                                              ", cpuid bf16 features: " + cpu_bf16_features().to_string() +
                                              "; oneDNN needs avx512_core_bf16 or amx): bf16 GEMMs compute in fp32, not accelerated");
    }
    const std::size_t a_rows = trans_a ? k : m, a_cols = trans_a ? m : k;
    const std::size_t b_rows = trans_b ? n : k, b_cols = trans_b ? k : n;
    thread_local std::vector<float> a32, b32;
    const float* wide_a = shared::widen_into(current(), a, a_rows, a_cols, lda, a32);
    const float* wide_b = shared::widen_into(current(), b, b_rows, b_cols, ldb, b32);
    gemm(trans_a, trans_b, m, n, k, alpha, wide_a, a_cols, wide_b, b_cols, beta, c, ldc);
}

/// `count` bf16 products C_i = alpha op(A_i) op(B_i) + beta C_i in one oneDNN call, laid out as
/// Kernels::gemm_batched_bf16 (A_i at a + i stride_a, likewise B_i and C_i; stride 0 shares one
/// operand, e.g. a weight). Returns false, computing nothing, where that is not worth one call:
/// fewer than two items, CPUs without bf16 units, items whose C overlap, and layouts oneDNN's
/// batch-reduce kernels do not take (each item's matrices must be dense); the caller then runs the
/// items one by one. The mixer's 32 [16 x 16] x [16 x 64] products ran 2.9x as fast as one call
/// as in 32 (AMD EPYC Zen 4, one thread, 2026-11-24; benchmarks/gemm_bf16/onednn_batch_layouts.cpp).
inline bool gemm_batched_bf16(std::size_t count, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                              const bfloat16* a, std::size_t lda, std::size_t stride_a, const bfloat16* b, std::size_t ldb, std::size_t stride_b,
                              float beta, float* c, std::size_t ldc, std::size_t stride_c) {
    if (count < 2 || m == 0 || n == 0 || k == 0) return false;
    shared::check_gemm_layout("onednn::gemm_batched_bf16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
    if (!bf16_support().accelerated || stride_c < (m - 1) * ldc + n) return false;  // no bf16 units; the items' outputs overlap
    detail::Key key = detail::product_key(dnnl::memory::data_type::bf16, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta);
    key.count = count;
    key.stride_a = stride_a;
    key.stride_b = stride_b;
    key.stride_c = stride_c;
    return detail::run(key, a, b, c);
}

/// op(a) x op(b) for bfloat16 matrices as a new float tensor [m, n], through gemm_bf16 above (the
/// oneDNN counterpart of olmax::backend::matmul_bf16; same shapes, same errors).
inline Tensor<float> matmul_bf16(const Tensor<bfloat16>& a, const Tensor<bfloat16>& b, bool trans_a = false, bool trans_b = false) {
    return shared::matmul_bf16_through("onednn::matmul_bf16", a, b, trans_a, trans_b, [](auto... args) { gemm_bf16(args...); });
}

/// The implementation oneDNN chose for a bf16 (or fp32) product of these sizes with the current
/// thread count, e.g. "brg:avx512_core_amx", "gemm:jit"; empty when it has none (benchmarks, tests).
inline std::string implementation(bool bf16, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k) {
    detail::Key key = detail::product_key(bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32, trans_a, trans_b, m, n, k,
                                          trans_a ? m : k, trans_b ? k : n, n, 1.0f, 0.0f);
    key.threads = detail::threads_for_call();
    shared::omp_thread_cap cap(key.threads);
    const auto e = detail::entry(key);
    return e->available ? e->impl : std::string();
}

}  // namespace olmax::backend::onednn
