#pragma once
// Options, result type and memory layouts of olmax::scan::scan.

#include <optional>

#include "olmax/core/tensor.hpp"

namespace olmax::scan {

/// Memory layout of gates, x and h: `btc` = [batch, time, channels] (channels contiguous, the
/// default), `bct` = [batch, channels, time] (time contiguous).
enum class Layout { btc, bct };

/// Options of a scan h_t = a_t * h_{t-1} + x_t.
template <class T>
struct ScanOptions {
    /// Initial state h_{-1}, shape [batch, channels]; undefined means zeros. Differentiable.
    Tensor<T> h0 = {};
    /// Scan from the last time step to the first (h_t = a_t * h_{t+1} + x_t).
    bool reverse = false;
    Layout layout = Layout::btc;
    /// Gates are given as log a (a = exp(gates)); the gradient is then d/d(log a) = da * a.
    bool log_gates = false;
    /// Overrides the chunk size of chunked strategies (must be >= 1; unset = the template size).
    std::optional<long> chunk = std::nullopt;
};

/// The scanned sequence and the final state (h at the last processed step, shape [batch, channels]).
template <class T>
struct ScanResult {
    Tensor<T> h;
    Tensor<T> h_last;
};

}  // namespace olmax::scan
