#pragma once
// Geometry of one scan call: sizes, strides and the raw pointers every kernel works on.

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <string>
#include <string_view>

#include "olmax/core/bfloat16.hpp"
#include "olmax/core/error.hpp"
#include "olmax/core/tensor.hpp"
#include "olmax/scan/options.hpp"

namespace olmax::scan::detail {

/// Sizes and element strides of a scan. A "row" is one (batch, channel) sequence. Gates may be
/// shared by `share` consecutive channels (heads of `share` channels, Mamba-2 style).
struct Geometry {
    std::size_t batch = 0, time = 0, channels = 0, gate_channels = 0, share = 1;
    Layout layout = Layout::btc;
    bool reverse = false, log_gates = false;
    // x/h strides (elements) along batch, time, channel; gate strides along batch, time, gate channel.
    std::size_t xb = 0, xt = 0, xc = 0, gb = 0, gt = 0, gc = 0;

    std::size_t rows() const { return batch * channels; }
    std::size_t x_index(std::size_t b, std::size_t t, std::size_t c) const { return b * xb + t * xt + c * xc; }
    std::size_t gate_index(std::size_t b, std::size_t t, std::size_t c) const {
        return b * gb + t * gt + (share == 1 ? c : c / share) * gc;  // skip the division in the common case
    }
    /// Time index of processing step s (the scan runs backwards in time when `reverse`).
    std::size_t time_of(std::size_t s) const { return reverse ? time - 1 - s : s; }
};

/// True when adjacent channels are adjacent in memory for x, h and the gates ([B, T, C], one gate
/// per channel): kernels then run contiguous vector loops across channels at every step.
inline bool contiguous_lanes(const Geometry& g) { return g.layout == Layout::btc && g.share == 1; }

/// The fix for gates given per channel (or per step) rather than per element: scans do not
/// broadcast their gates (a broadcast gate's gradient is a sum the caller should see), so the
/// message says how to expand them.
template <class T>
std::string expand_hint(const Tensor<T>& gates, const Tensor<T>& x) {
    if (gates.size() == 0 || x.size() % gates.size() != 0) return "";
    return olmax::detail::concat("; to use the same gates at every step (or for every batch row), expand them to x's shape first: "
                                 "gates + olmax::zeros_like(x) broadcasts and keeps their gradient, olmax::full<T>(x.shape(), a) "
                                 "makes constant ones");
}

/// Checks shapes and options and returns the geometry; throws shape_error / value_error naming `op`.
template <class T>
Geometry make_geometry(std::string_view op, const Tensor<T>& gates, const Tensor<T>& x, const ScanOptions<T>& opt) {
    check<value_error>(gates.defined() && x.defined(), op, ": gates and x must be defined tensors");
    check<shape_error>(x.rank() == 3, op, ": x must have rank 3 ([batch, time, channels] or [batch, channels, time]), got shape ",
                       to_string(x.shape()));
    check<shape_error>(gates.rank() == 3, op, ": gates of shape ", to_string(gates.shape()), " must have rank 3, the shape of x ",
                       to_string(x.shape()), " or [batch, time, heads] (one gate per head of channels)", expand_hint(gates, x));
    Geometry g;
    g.layout = opt.layout;
    g.reverse = opt.reverse;
    g.log_gates = opt.log_gates;
    const bool btc = opt.layout == Layout::btc;
    g.batch = x.extent(0);
    g.time = btc ? x.extent(1) : x.extent(2);
    g.channels = btc ? x.extent(2) : x.extent(1);
    g.gate_channels = btc ? gates.extent(2) : gates.extent(1);
    const std::size_t gate_time = btc ? gates.extent(1) : gates.extent(2);
    check<value_error>(g.time > 0, op, ": the sequence is empty (T = 0) in x of shape ", to_string(x.shape()));
    check<value_error>(g.batch > 0 && g.channels > 0, op, ": x of shape ", to_string(x.shape()), " has no rows (batch or channels is 0)");
    check<shape_error>(gates.extent(0) == g.batch && gate_time == g.time && g.gate_channels > 0 && g.channels % g.gate_channels == 0,
                       op, ": gates of shape ", to_string(gates.shape()), " do not fit x of shape ", to_string(x.shape()),
                       " (layout ", btc ? "btc" : "bct", "; gates need the same batch and time and a channel count that divides x's)",
                       expand_hint(gates, x));
    g.share = g.channels / g.gate_channels;
    if (opt.h0.defined())
        check<shape_error>(opt.h0.rank() == 2 && opt.h0.extent(0) == g.batch && opt.h0.extent(1) == g.channels, op, ": h0 of shape ",
                           to_string(opt.h0.shape()), " does not match [batch, channels] = [", g.batch, ", ", g.channels, "]");
    if (opt.chunk) check<value_error>(*opt.chunk >= 1, op, ": chunk size must be >= 1, got ", *opt.chunk);
    if (btc) {
        g.xb = g.time * g.channels, g.xt = g.channels, g.xc = 1;
        g.gb = g.time * g.gate_channels, g.gt = g.gate_channels, g.gc = 1;
    } else {
        g.xb = g.channels * g.time, g.xt = 1, g.xc = g.time;
        g.gb = g.gate_channels * g.time, g.gt = 1, g.gc = g.time;
    }
    return g;
}

/// Raw pointers of a forward call (h0 and h_last may be null).
template <class T>
struct ForwardArgs {
    const T* gates;
    const T* x;
    const T* h0;
    T* h;
    T* h_last;
};

/// Raw pointers of a backward call: inputs dh (gradient of h), dh_last (may be null), saved
/// gates, h and h0 (may be null); outputs dx, da (per channel, shape of x when gates are shared),
/// dh0 (may be null).
template <class T>
struct BackwardArgs {
    const T* dh;
    const T* dh_last;
    const T* gates;
    const T* h;
    const T* h0;
    T* dx;
    T* da;
    T* dh0;
};

/// dst = value rounded to the storage type T. For bfloat16 the rounded bits are copied in rather
/// than assigned as a bfloat16 object: inside `omp simd` loops GCC turns such a temporary object
/// into a per-lane array and gives up vectorising the loop (measured: the bf16 forward ran at 60%
/// of the float one's elements/s).
template <class T, class Acc>
[[gnu::always_inline]] inline void store_value(T& dst, Acc value) {
    if constexpr (std::is_same_v<T, bfloat16>) {
        const std::uint16_t bits = bfloat16::round_bits(std::bit_cast<std::uint32_t>(static_cast<float>(value)));
        std::memcpy(static_cast<void*>(&dst), &bits, sizeof bits);
    } else {
        dst = T(value);
    }
}

template <bool Log, class Acc, class T>
inline Acc load_gate(T value) {
    if constexpr (Log) return std::exp(Acc(value));
    else return Acc(value);
}

}  // namespace olmax::scan::detail
