#pragma once
// The StableHLO form of an eager scan strategy: how a layer that scans with `Strategy` on the CPU
// lowers its recurrence into a traced program (xla::graph::linear_scan). The strategies the module
// library has (stablehlo/scan.hpp) map to themselves; the CPU-only ones, which compute the same
// values by other means, to chunked_matmul<128>, the matrix-unit form.

#include <cstddef>
#include <cstdint>

#include "olmax/backend/xla/stablehlo/scan_strategy.hpp"
#include "olmax/scan/strategies.hpp"

namespace olmax::scan {

namespace detail {
template <class Strategy>
struct lowered_strategy {
    static xla::stablehlo::scan_strategy get() { return xla::stablehlo::scan_strategy::chunked_matmul<128>(); }
};
template <>
struct lowered_strategy<sequential> {
    static xla::stablehlo::scan_strategy get() { return xla::stablehlo::scan_strategy::sequential(); }
};
template <>
struct lowered_strategy<hillis_steele> {
    static xla::stablehlo::scan_strategy get() { return xla::stablehlo::scan_strategy::hillis_steele(); }
};
template <std::size_t C>
struct lowered_strategy<chunked_matmul<C>> {
    static xla::stablehlo::scan_strategy get() { return xla::stablehlo::scan_strategy::chunked_matmul<static_cast<std::int64_t>(C)>(); }
};
}  // namespace detail

/// How `Strategy`'s scans lower to StableHLO (see the file comment).
template <class Strategy>
xla::stablehlo::scan_strategy lowered_scan_strategy() {
    return detail::lowered_strategy<Strategy>::get();
}

}  // namespace olmax::scan
