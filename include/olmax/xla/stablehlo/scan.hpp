#pragma once
// Linear scans h_t = a_t h_{t-1} + x_t in StableHLO: the lowerings of the graph's linear_scan (a
// while loop over time, Hillis-Steele doubling, chunked triangular matmuls, blocks scanned side by
// side).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "olmax/xla/stablehlo/function_builder.hpp"
#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/xla/stablehlo/scan_strategy.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

namespace detail {

/// [B, T, X] (or [B, T]) padded at the end of time to `steps` with `fill`.
inline value pad_time(function_builder& b, const value& x, std::int64_t steps, double fill) {
    const std::int64_t extra = steps - x.type.dims[1];
    if (extra == 0) return x;
    dims_t low(x.type.rank(), 0), high(x.type.rank(), 0);
    high[1] = extra;
    return b.pad(x, fill, low, high);
}
inline value unpad_time(function_builder& b, const value& x, std::int64_t steps) {
    if (x.type.dims[1] == steps) return x;
    dims_t limit = x.type.dims;
    limit[1] = steps;
    return b.slice(x, dims_t(x.type.rank(), 0), limit);
}

/// x shifted by `d` towards higher indices along `axis` (the first d entries become `fill`).
inline value shift_up(function_builder& b, const value& x, std::int64_t axis, std::int64_t d, double fill) {
    dims_t low(x.type.rank(), 0), high(x.type.rank(), 0);
    low[static_cast<std::size_t>(axis)] = d;
    high[static_cast<std::size_t>(axis)] = -d;
    return b.pad(x, fill, low, high);
}

/// Inclusive scan of the affine maps (A, X) along `axis`, Hillis–Steele: ceil(log2 n) steps of
/// X <- X + A * shift(X, d), A <- A * shift(A, d) with d = 1, 2, 4, ... (the olmax QRNN loop).
inline value hillis_steele(function_builder& b, value gates, value x, std::int64_t axis) {
    const std::int64_t n = x.type.dims[static_cast<std::size_t>(axis)];
    for (std::int64_t d = 1; d < n; d *= 2) {
        x = b.add(x, b.mul(gates, shift_up(b, x, axis, d, 0.0)));
        if (2 * d < n) gates = b.mul(gates, shift_up(b, gates, axis, d, 1.0));
    }
    return x;
}

/// Inclusive cumulative product along `axis` by log-depth doubling.
inline value cumprod(function_builder& b, value x, std::int64_t axis) {
    const std::int64_t n = x.type.dims[static_cast<std::size_t>(axis)];
    for (std::int64_t d = 1; d < n; d *= 2) x = b.mul(x, shift_up(b, x, axis, d, 1.0));
    return x;
}

/// Sequential scan along axis 1 of [B, T, ...] as a stablehlo.while over time: carry (k, h, out,
/// a, x); one step per iteration, reading and writing one [B, 1, ...] slice.
inline value sequential_scan(function_builder& b, const value& a, const value& x) {
    const std::size_t rank = x.type.rank();
    const std::int64_t steps = x.type.dims[1];
    std::int64_t run = 1;  // contiguous elements per leading index in one step's slice
    for (std::size_t d = 2; d < rank; ++d) run *= x.type.dims[d];
    // A step's slice is B runs of `run` contiguous elements. Short runs (a [rows, T] scan: 1) make it
    // a column strided by T, so the loop then runs time-major ([T, B, ...]: one contiguous slice per
    // step; faster on the XLA CPU plugin, benchmarks/RESULTS.md, "One definition on XLA"). Long runs
    // ([B, T, E, N] of Mamba's states) are read in place, without transposes.
    const bool time_major = run < 16;
    dims_t swap(rank);
    for (std::size_t d = 0; d < rank; ++d) swap[d] = std::int64_t(d);
    std::swap(swap[0], swap[1]);
    const value at = time_major ? b.transpose(a, swap) : a, xt = time_major ? b.transpose(x, swap) : x;
    const std::size_t time = time_major ? 0 : 1;
    dims_t step_dims = at.type.dims;
    step_dims[time] = 1;
    const auto results = b.while_loop(
        {b.index(0), b.constant(0.0, f32(step_dims)), b.constant(0.0, at.type), at, xt},
        [steps](function_builder& r, const std::vector<value>& c) {
            return r.compare(c[0], r.index(steps), compare_direction::LT);
        },
        [rank, time, step_dims](function_builder& r, const std::vector<value>& c) {
            std::vector<value> start(rank, r.index(0));
            start[time] = c[0];
            const value h = r.add(r.mul(r.dynamic_slice(c[3], start, step_dims), c[1]), r.dynamic_slice(c[4], start, step_dims));
            const value out = r.dynamic_update_slice(c[2], h, start);
            return std::vector<value>{r.add(c[0], r.index(1)), h, out, c[3], c[4]};
        });
    return time_major ? b.transpose(results[2], swap) : results[2];
}

/// Chunked scan with per-chunk lower-triangular transfer matrices on the matrix unit:
///   A_c[i, j] = prod_{k=j+1..i} a_k (i >= j, else 0), built by a log-depth row-wise cumulative
///   product (never exp of log-gates: log 0 = -inf, nor P_i / P_j: underflow), then
///   h_local = A_c x_c by a batched dot_general; chunk summaries (P_last, h_local_last) are scanned
///   across chunks (Hillis–Steele) and fixed up: h = h_local + P * H_{c-1}.
inline value chunked_matmul_scan(function_builder& b, value a, value x, std::int64_t chunk) {
    const std::int64_t rows = x.type.dims[0], steps = x.type.dims[1];
    const std::int64_t chunks = (steps + chunk - 1) / chunk, padded = chunks * chunk;
    a = pad_time(b, a, padded, 1.0);  // padded at the end of time: later steps never affect earlier ones
    x = pad_time(b, x, padded, 0.0);
    const dims_t square{rows, chunks, chunk, chunk};
    const value a3 = b.reshape(a, {rows, chunks, chunk});
    const value x3 = b.reshape(x, {rows, chunks, chunk});
    // Masks from two iotas (constant-folded by XLA).
    const tensor_type qq{{chunk, chunk}, element::i32};
    const value row_index = b.iota(qq, 0), col_index = b.iota(qq, 1);
    const value strictly_lower = b.broadcast_in_dim(b.compare(row_index, col_index, compare_direction::GT), square, {2, 3});
    const value lower = b.broadcast_in_dim(b.compare(row_index, col_index, compare_direction::GE), square, {2, 3});
    // G[i, j] = a_i below the diagonal, 1 elsewhere; cumulative product down the rows gives A_c.
    const value gates_by_row = b.broadcast_in_dim(a3, square, {0, 1, 2});
    const value g = b.select(strictly_lower, gates_by_row, b.constant(1.0, f32(square)));
    const value transfer = b.select(lower, cumprod(b, g, 2), b.constant(0.0, f32(square)));
    const value local = b.dot_general(transfer, x3, {0, 1}, {0, 1}, {3}, {2});  // [rows, chunks, chunk]
    // P_i = prod_{k=0..i} a_k inside the chunk = A_c[i, 0] * a_0.
    const value first_column = b.reshape(b.slice(transfer, {0, 0, 0, 0}, {rows, chunks, chunk, 1}), {rows, chunks, chunk});
    const value first_gate = b.broadcast_in_dim(b.reshape(b.slice(a3, {0, 0, 0}, {rows, chunks, 1}), {rows, chunks}), {rows, chunks, chunk}, {0, 1});
    const value prefix = b.mul(first_column, first_gate);
    if (chunks > 1) {
        const value chunk_gate = b.reshape(b.slice(prefix, {0, 0, chunk - 1}, {rows, chunks, chunk}), {rows, chunks});
        const value chunk_state = b.reshape(b.slice(local, {0, 0, chunk - 1}, {rows, chunks, chunk}), {rows, chunks});
        const value carry_out = hillis_steele(b, chunk_gate, chunk_state, 1);           // state after chunk c
        const value carry_in = shift_up(b, carry_out, 1, 1, 0.0);                       // state before chunk c
        const value fixed = b.add(local, b.mul(prefix, b.broadcast_in_dim(carry_in, {rows, chunks, chunk}, {0, 1})));
        x = b.reshape(fixed, {rows, padded});
    } else {
        x = b.reshape(local, {rows, padded});
    }
    return unpad_time(b, x, steps);
}

/// The hillis_steele_chunked form's steps per chunk: `asked`, or about sqrt(T) when 0 (at most T).
inline std::int64_t block_steps(std::int64_t asked, std::int64_t steps) {
    if (asked > 0) return std::min(asked, steps);
    std::int64_t l = 1;
    while (l * l < steps) ++l;
    return l;
}

/// The hillis_steele_chunked form along axis 1 of [B, T, ...]: time cut into nb blocks (its chunks)
/// of L steps, padded at the end with a = 1, x = 0. One stablehlo.while over a block's L positions
/// scans every block from a zero state at once, keeping h_local and the gates' running product P;
/// the carries follow by doubling over the block summaries (P_last, h_local_last), then one fix-up
/// pass: h = h_local + P * H_{c-1}. L + log2(nb) dependent steps instead of T, a few passes over
/// memory instead of doubling's 2 log2(T). Short runs: block position outermost (as sequential_scan).
inline value hillis_steele_chunked_scan(function_builder& b, value a, value x, std::int64_t asked) {
    const std::size_t rank = x.type.rank();
    const std::int64_t batch = x.type.dims[0], steps = x.type.dims[1];
    const std::int64_t L = block_steps(asked, steps), nb = (steps + L - 1) / L, padded = nb * L;
    dims_t rest;
    std::int64_t run = 1;
    for (std::size_t d = 2; d < rank; ++d) {
        rest.push_back(x.type.dims[d]);
        run *= x.type.dims[d];
    }
    a = pad_time(b, a, padded, 1.0);
    x = pad_time(b, x, padded, 0.0);
    dims_t blocks{batch, nb, L};  // [B, nb, L, ...]
    blocks.insert(blocks.end(), rest.begin(), rest.end());
    const bool position_major = run < 16;
    dims_t to_layout(rank + 1), from_layout(rank + 1);  // [B, nb, L, ...] -> [L, B, nb, ...] and back
    for (std::size_t d = 0; d <= rank; ++d) to_layout[d] = std::int64_t(d);
    if (position_major) {
        to_layout = {2, 0, 1};
        for (std::size_t d = 3; d <= rank; ++d) to_layout.push_back(std::int64_t(d));
    }
    for (std::size_t d = 0; d <= rank; ++d) from_layout[std::size_t(to_layout[d])] = std::int64_t(d);
    auto to = [&](const value& v) { return position_major ? b.transpose(b.reshape(v, blocks), to_layout) : b.reshape(v, blocks); };
    const value al = to(a), xl = to(x);
    const std::size_t position = position_major ? 0 : 2, block_axis = position_major ? 2 : 1;
    dims_t step_dims = al.type.dims;
    step_dims[position] = 1;
    const auto loop = b.while_loop(
        {b.index(0), b.constant(0.0, f32(step_dims)), b.constant(1.0, f32(step_dims)), b.constant(0.0, al.type), b.constant(0.0, al.type), al, xl},
        [L](function_builder& r, const std::vector<value>& c) { return r.compare(c[0], r.index(L), compare_direction::LT); },
        [rank, position, step_dims](function_builder& r, const std::vector<value>& c) {
            std::vector<value> start(rank + 1, r.index(0));
            start[position] = c[0];
            const value gate = r.dynamic_slice(c[5], start, step_dims);
            const value h = r.add(r.mul(gate, c[1]), r.dynamic_slice(c[6], start, step_dims));
            const value p = r.mul(gate, c[2]);
            return std::vector<value>{r.add(c[0], r.index(1)), h, p, r.dynamic_update_slice(c[3], h, start),
                                      r.dynamic_update_slice(c[4], p, start), c[5], c[6]};
        });
    value h = loop[3];
    if (nb > 1) {
        const value prefix = loop[4];
        // The blocks' summaries at the last position: [.., nb, ..] without the position axis.
        dims_t begin(rank + 1, 0), end = h.type.dims, summary_dims;
        begin[position] = L - 1;
        for (std::size_t d = 0; d <= rank; ++d)
            if (d != position) summary_dims.push_back(h.type.dims[d]);
        auto last = [&](const value& v) { return b.reshape(b.slice(v, begin, end), summary_dims); };
        const std::int64_t summary_block_axis = std::int64_t(block_axis) - (position < block_axis ? 1 : 0);
        const value carry_out = hillis_steele(b, last(prefix), last(h), summary_block_axis);  // the state after block c
        const value carry_in = shift_up(b, carry_out, summary_block_axis, 1, 0.0);           // the state entering block c
        dims_t broadcast;
        for (std::size_t d = 0; d <= rank; ++d)
            if (d != position) broadcast.push_back(std::int64_t(d));
        h = b.add(h, b.mul(prefix, b.broadcast_in_dim(carry_in, h.type.dims, broadcast)));
    }
    dims_t full{batch, padded};
    full.insert(full.end(), rest.begin(), rest.end());
    h = b.reshape(position_major ? b.transpose(h, from_layout) : h, full);
    return unpad_time(b, h, steps);
}

}  // namespace detail

/// Inclusive scan h_t = a_t h_{t-1} + x_t from a zero state along dimension 1 of [B, T, ...] values.
inline value emit_scan(function_builder& b, const scan_strategy& strategy, const value& a, const value& x) {
    check<shape_error>(a.type == x.type && x.type.rank() >= 2, "scan: gates ", a.type.str(), " and inputs ", x.type.str(),
                       " must both be [B, T, ...]");
    switch (strategy.strategy) {
        case scan_strategy::kind::sequential: return detail::sequential_scan(b, a, x);
        case scan_strategy::kind::hillis_steele: return detail::hillis_steele(b, a, x, 1);
        case scan_strategy::kind::hillis_steele_chunked:
            check<value_error>(strategy.chunk >= 0, "scan: hillis_steele_chunked steps per chunk must not be negative, got ", strategy.chunk);
            return detail::hillis_steele_chunked_scan(b, a, x, strategy.chunk);
        case scan_strategy::kind::chunked_matmul: {
            check<value_error>(strategy.chunk >= 1, "scan: chunked_matmul chunk must be positive, got ", strategy.chunk);
            if (x.type.rank() == 2) return detail::chunked_matmul_scan(b, a, x, strategy.chunk);
            // [B, T, ...] -> [B, ..., T] -> [rows, T] for the chunks' matmuls, and back.
            const std::size_t rank = x.type.rank();
            dims_t time_last{0}, back{0, std::int64_t(rank) - 1}, moved{x.type.dims[0]};
            for (std::size_t d = 2; d < rank; ++d) {
                time_last.push_back(std::int64_t(d));
                back.push_back(std::int64_t(d) - 1);
                moved.push_back(x.type.dims[d]);
            }
            time_last.push_back(1);
            moved.push_back(x.type.dims[1]);
            const std::int64_t steps = x.type.dims[1], rows = x.type.elements() / steps;
            auto rows_of = [&](const value& v) { return b.reshape(b.transpose(v, time_last), {rows, steps}); };
            const value h = detail::chunked_matmul_scan(b, rows_of(a), rows_of(x), strategy.chunk);
            return b.transpose(b.reshape(h, moved), back);
        }
    }
    return x;
}

}  // namespace olmax::xla::stablehlo
