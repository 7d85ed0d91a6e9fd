// The scan kernels compiled for this machine's vector ISA (see CMakeLists.txt beside this file):
// the vector blocks' bf16 loads and stores against the scalar conversions bit for bit, and
// two_pass's in-register block path (rows whose steps are adjacent in memory) against the fp64
// reference, in fp32 and in bf16 storage, forward and backward; and the streaming stores of the
// widest vectors against ordinary stores.
#include "test_helpers.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "olmax/scan/scan.hpp"
#include "scan_streaming_check.hpp"

namespace sc = olmax::scan;
using olmax::bfloat16;
using olmax::Shape;
using olmax::Tensor;

namespace {

/// Normwise relative error: max |got - ref| / max |ref|.
template <class T>
double normwise_error(const Tensor<T>& got, const Tensor<double>& ref) {
    REQUIRE(got.shape() == ref.shape());
    double err = 0, scale = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = double(got.data()[i]);
        err = std::isnan(g) ? INFINITY : std::max(err, std::abs(g - ref.data()[i]));
        scale = std::max(scale, std::abs(ref.data()[i]));
    }
    return err / scale;
}

/// h, h_last, d gates, dx, dh0 of one scan through `scan_with_state<S>` and `scan_backward<S>`.
template <class S, class T>
std::vector<Tensor<double>> scan_and_adjoint(const Tensor<T>& gates, const Tensor<T>& x, const Tensor<T>& h0, const Tensor<T>& dh,
                                             const Tensor<T>& dh_last, const sc::ScanOptions<T>& options) {
    sc::ScanOptions<T> opt = options;
    opt.h0 = h0;
    const auto [h, h_last] = sc::scan_with_state<S>(gates, x, opt);
    const auto d = sc::scan_backward<S>(gates, h, dh, opt, dh_last);
    return {olmax::cast<double>(h), olmax::cast<double>(h_last), olmax::cast<double>(d.gates), olmax::cast<double>(d.x),
            olmax::cast<double>(d.h0)};
}

/// two_pass in storage T against sequential_fp64 on the same (T-rounded) inputs in double, on rows
/// whose steps are adjacent in memory: one long row of [1, T, 1] and the rows of [B, C, T].
template <class T>
void check_block_path(double tolerance) {
    olmax::Generator rng(31);
    for (const sc::Layout layout : {sc::Layout::btc, sc::Layout::bct})
        for (const bool reverse : {false, true}) {
            const Shape shape = layout == sc::Layout::btc ? Shape{1, 20011, 1} : Shape{2, 3, 1111};
            const std::size_t rows = layout == sc::Layout::btc ? 1 : 6;
            const Tensor<T> gates = olmax::cast<T>(olmax::rand<float>(shape, rng, 0.5f, 1.0f));
            const Tensor<T> x = olmax::cast<T>(olmax::rand<float>(shape, rng, -1.0f, 1.0f));
            const Tensor<T> dh = olmax::cast<T>(olmax::rand<float>(shape, rng, -1.0f, 1.0f));
            const Shape state_shape = {shape[0], layout == sc::Layout::btc ? shape[2] : shape[1]};
            const Tensor<T> h0 = olmax::cast<T>(olmax::rand<float>(state_shape, rng, -1.0f, 1.0f));
            const Tensor<T> dh_last = olmax::cast<T>(olmax::rand<float>(state_shape, rng, -1.0f, 1.0f));
            const sc::ScanOptions<T> opt{.reverse = reverse, .layout = layout};
            const sc::ScanOptions<double> opt64{.reverse = reverse, .layout = layout};
            const auto ref = scan_and_adjoint<sc::sequential_fp64>(olmax::cast<double>(gates), olmax::cast<double>(x), olmax::cast<double>(h0),
                                                                   olmax::cast<double>(dh), olmax::cast<double>(dh_last), opt64);
            auto& round = sc::detail::two_pass_round_elements();
            const std::size_t saved = round.load();
            for (const std::size_t round_elements : {std::size_t(96), saved}) {  // many rounds of short segments, and the default
                round = round_elements;
                const auto ours = scan_and_adjoint<sc::two_pass>(gates, x, h0, dh, dh_last, opt);
                INFO("rows " << rows << ", reverse " << reverse << ", round " << round_elements);
                const char* names[] = {"h", "h_last", "d gates", "dx", "dh0"};
                for (std::size_t i = 0; i < ours.size(); ++i) {
                    INFO(names[i]);
                    CHECK(normwise_error(ours[i], ref[i]) <= tolerance);
                }
            }
            round = saved;
        }
}

}  // namespace

#if (defined(__GNUC__) && __GNUC__ >= 12) || defined(__clang__)
TEST_CASE("native: a vector block's bf16 stores round as bfloat16::round_bits, bit for bit", "[scan][bf16]") {
    // Every exponent but the denormal one (the scan kernels run with denormals flushed, so they
    // store none; vcvtneps2bf16 reads them as zero), with mantissas around the rounding boundary
    // (ties to even, just below and above), plus zeros, infinities, the largest finite float
    // (rounds to infinity) and quiet and signalling NaNs with payloads.
    std::vector<std::uint32_t> patterns = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                                           0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu, 0x7FFFFFFFu, 0x7F810000u};
    olmax::Generator rng(7);
    for (std::uint32_t sign : {0u, 0x80000000u})
        for (std::uint32_t exponent = 1; exponent < 255; ++exponent)
            for (std::uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x18000u, 0x10000u})
                patterns.push_back(sign | (exponent << 23) | (((std::uint32_t(rng.next_u64()) & 0x7E0000u) | low) & 0x7FFFFFu));
    while (patterns.size() % 16) patterns.push_back(0x3F800000u);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < patterns.size(); i += 16) {
        sc::detail::block_f32 v;
        std::memcpy(&v, &patterns[i], sizeof v);
        bfloat16 up[16], down[16];
        sc::detail::store_steps<false>(up, v);
        sc::detail::store_steps<true>(down + 15, v);  // descending: lane j to down[15 - j]
        for (std::size_t j = 0; j < 16; ++j) {
            const std::uint16_t want = bfloat16::round_bits(patterns[i + j]);
            if (std::bit_cast<std::uint16_t>(up[j]) != want || std::bit_cast<std::uint16_t>(down[15 - j]) != want) {
                ++mismatches;
                UNSCOPED_INFO("float bits 0x" << std::hex << patterns[i + j] << ": stored 0x" << std::bit_cast<std::uint16_t>(up[j]) << " / 0x"
                                              << std::bit_cast<std::uint16_t>(down[15 - j]) << ", round_bits 0x" << want);
            }
        }
    }
    CHECK(patterns.size() > 3000);
    CHECK(mismatches == 0);
}

TEST_CASE("native: a vector block's bf16 loads widen every bfloat16 exactly", "[scan][bf16]") {
    std::vector<std::uint16_t> all(65536);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::uint16_t(i);
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < all.size(); i += 16) {
        const auto* p = reinterpret_cast<const bfloat16*>(all.data() + i);
        sc::detail::block_f32 up, down;
        sc::detail::load_steps<false>(p, up);
        sc::detail::load_steps<true>(p + 15, down);  // descending: lane j from p[15 - j]
        for (std::size_t j = 0; j < 16; ++j) {
            const std::uint32_t want = std::uint32_t(all[i + j]) << 16;
            if (std::bit_cast<std::uint32_t>(float(up[j])) != want || std::bit_cast<std::uint32_t>(float(down[15 - j])) != want) ++mismatches;
        }
    }
    CHECK(mismatches == 0);
}
#endif

TEST_CASE("native: two_pass's block path in fp32 equals the fp64 reference", "[scan]") {
    check_block_path<float>(1e-5);  // the unit tests' fp32 tolerance for every strategy
}

TEST_CASE("native: two_pass's block path in bf16 storage stays within bf16 rounding of the fp64 reference", "[scan][bf16]") {
    // One rounding of each output to bf16 (2^-8 relative) and of the saved h the adjoint reads; a
    // carry that went wrong by one block would be off by O(1).
    check_block_path<bfloat16>(0x1p-6);
}

TEST_CASE("native: streaming stores give the ordinary stores' values bit for bit", "[scan]") { olmax_test::check_streaming_stores_bitwise(); }
