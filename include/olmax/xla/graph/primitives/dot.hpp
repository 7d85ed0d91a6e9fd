#pragma once
// Matrix products (dot) and the sum across the replicas of a replicated program (all_reduce_sum).

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/bfloat16.hpp"
#include "olmax/xla/graph/ir.hpp"

namespace olmax::xla::graph {

namespace prim {

/// Product of two matrices contracting lhs dimension `dims[0]` with rhs dimension `dims[1]` (0 or
/// 1, counted within the matrix); result [lhs free, rhs free]. Rank-3 operands are batches of
/// matrices with the same leading size, multiplied pairwise: result [batch, lhs free, rhs free].
/// Lowered with `precision = HIGHEST`. Its gradients are two more products.
/// With `bf16_operands` (the bf16 precision policy, docs/BF16.md) both operands are rounded to
/// bfloat16 (nearest, ties to even) and their exact products summed in f32, as bf16 matrix units and
/// backend::Bf16MatmulKernels compute: a `stablehlo.convert` of each operand to bf16, then a
/// dot_general bf16 x bf16 -> f32. Its gradient products are bf16 dots too, as the CPU policy's
/// backward GEMMs; the rounding itself passes gradients straight through.
struct dot {
    static constexpr std::string_view name = "dot";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& lhs, const var& rhs, std::int64_t lhs_contract, std::int64_t rhs_contract, bool bf16_operands = false) {
        detail::require_f32(name, lhs);
        detail::require_f32(name, rhs);
        const std::size_t rank = lhs.type().rank();
        check<graph_error>((rank == 2 || rank == 3) && rhs.type().rank() == rank && (lhs_contract == 0 || lhs_contract == 1) &&
                               (rhs_contract == 0 || rhs_contract == 1) && (rank == 2 || lhs.dims()[0] == rhs.dims()[0]),
                           "xla::graph: dot takes two matrices, or two batches of as many matrices (rank 3), and one contracting dimension each, got ",
                           lhs.type().str(), " x ", rhs.type().str());
        const std::size_t batch = rank - 2;  // 1 when the leading dimension is a batch
        const auto k = lhs.dims()[batch + std::size_t(lhs_contract)];
        check<graph_error>(k == rhs.dims()[batch + std::size_t(rhs_contract)], "xla::graph: dot: contracting sizes differ: ", lhs.type().str(),
                           " (matrix dimension ", lhs_contract, ") x ", rhs.type().str(), " (matrix dimension ", rhs_contract, ")");
        dims_t out;
        if (batch) out.push_back(lhs.dims()[0]);
        out.push_back(lhs.dims()[batch + std::size_t(1 - lhs_contract)]);
        out.push_back(rhs.dims()[batch + std::size_t(1 - rhs_contract)]);
        node n = detail::make_node<dot>({lhs, rhs}, f32(out));
        n.dims = {lhs_contract, rhs_contract};
        n.bf16_operands = bf16_operands;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {  // rank 3: dimension 0 is the batch
        const std::int64_t batch = std::int64_t(in[0].type.rank()) - 2;
        const dims_t batch_dims = batch ? dims_t{0} : dims_t{};
        if (n.bf16_operands)
            return b.dot_general(b.convert(in[0], element::bf16), b.convert(in[1], element::bf16), batch_dims, batch_dims, {batch + n.dims[0]},
                                 {batch + n.dims[1]}, element::f32);
        return b.dot_general(in[0], in[1], batch_dims, batch_dims, {batch + n.dims[0]}, {batch + n.dims[1]});
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {
        const auto& a = *in[0];
        const auto& b = *in[1];
        const std::size_t lead = a.type.rank() - 2;
        const std::int64_t batches = lead ? a.type.dims[0] : 1;
        const std::int64_t ca = n.dims[0], cb = n.dims[1];
        const std::int64_t K = a.type.dims[lead + std::size_t(ca)], I = out.type.dims[lead], J = out.type.dims[lead + 1];
        const std::int64_t a_cols = a.type.dims[lead + 1], b_cols = b.type.dims[lead + 1];
        const std::int64_t a_size = a.type.dims[lead] * a_cols, b_size = b.type.dims[lead] * b_cols;
        // bf16 operands: each value rounded once to the nearest bfloat16 (exact in double, as their
        // products are); the sums stay double, the reference's.
        const auto operand = [&](double x) { return n.bf16_operands ? double(float(bfloat16(x))) : x; };
        for (std::int64_t q = 0; q < batches; ++q)
            for (std::int64_t i = 0; i < I; ++i)
                for (std::int64_t j = 0; j < J; ++j) {
                    double s = 0;
                    for (std::int64_t k = 0; k < K; ++k) {
                        const double x = operand(a.data[std::size_t(q * a_size + (ca == 1 ? i * a_cols + k : k * a_cols + i))]);
                        const double y = operand(b.data[std::size_t(q * b_size + (cb == 0 ? k * b_cols + j : j * b_cols + k))]);
                        s += x * y;
                    }
                    out.data[std::size_t((q * I + i) * J + j)] = s;
                }
    }
    /// Y = A B with A read as [I, K] (contract 1) or [K, I] (contract 0) and B as [K, J] (contract
    /// 0) or [J, K] (contract 1): dA and dB in A's and B's own layouts (A B: dA = G B^T, dB = A^T G).
    static void gradient(vjp& v) {
        const std::int64_t ca = v.n.dims[0], cb = v.n.dims[1];
        const var& a = v.x[0];
        const var& b = v.x[1];
        const var& g = v.gy[0];
        const bool r = v.n.bf16_operands;
        if (v.needs(0)) v.dx[0] = ca == 1 ? make(g, b, 1, 1 - cb, r) : make(b, g, 1 - cb, 1, r);
        if (v.needs(1)) v.dx[1] = cb == 0 ? make(a, g, 1 - ca, 0, r) : make(g, a, 0, 1 - ca, r);
    }
};

/// The sum of x over all `axis` replicas of a replicated program (compiled with that many replicas,
/// xla::device_program); in a program of one replica, x itself. Its gradient is the same sum of the
/// gradients (every replica's output depends on every replica's input).
struct all_reduce_sum {
    static constexpr std::string_view name = "all_reduce_sum";
    static constexpr bool saved_by_kept_layers = true;
    static var make(const var& x, std::int64_t replicas) {
        detail::require_f32(name, x);
        check<graph_error>(replicas >= 1, "xla::graph: all_reduce_sum: replicas must be positive, got ", replicas);
        node n = detail::make_node<all_reduce_sum>({x}, x.type());
        n.axis = replicas;
        return detail::commit(std::move(n));
    }
    static value emit(function_builder& b, const node& n, const std::vector<value>& in) {
        return n.axis == 1 ? in[0] : b.all_reduce_sum(in[0], n.axis);
    }
    static void evaluate(const node& n, const std::vector<const host_value*>& in, host_value& out) {  // the reference evaluates one replica
        check<graph_error>(n.axis == 1, "xla::graph: evaluate runs one replica; all_reduce_sum over ", n.axis,
                           " replicas needs a replicated device_program");
        out.data = in[0]->data;
    }
    static void gradient(vjp& v) { v.dx[0] = make(v.gy[0], v.n.axis); }
};

}  // namespace prim

/// prim::dot contracting lhs dimension `lhs_contract` with rhs dimension `rhs_contract`.
inline var dot(const var& lhs, const var& rhs, std::int64_t lhs_contract, std::int64_t rhs_contract, bool bf16_operands = false) {
    return prim::dot::make(lhs, rhs, lhs_contract, rhs_contract, bf16_operands);
}
inline var matmul(const var& a, const var& b, bool bf16_operands = false) { return dot(a, b, 1, 0, bf16_operands); }

/// The sum of x over all `replicas` copies of a replicated program (prim::all_reduce_sum).
inline var all_reduce_sum(const var& x, std::int64_t replicas) { return prim::all_reduce_sum::make(x, replicas); }

}  // namespace olmax::xla::graph
