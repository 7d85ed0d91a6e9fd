#pragma once
// The StableHLO function builder: one SSA value per op, regions for while/reduce, operand shapes
// checked as ops are added, and the printing of the whole module in the *generic* op form
// (`"stablehlo.add"(%a, %b) : (...) -> ...`), which is what a PJRT plugin's `"mlir"` program
// format parses. Every dot_general gets `precision = HIGHEST` (the default is one bf16 pass on TPU
// and TF32 on NVIDIA).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/xla/stablehlo/ir.hpp"
#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

namespace detail {

inline std::string list(const dims_t& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

/// `array<i64: 1, 2>` (or `array<i64>` when empty): the attribute syntax StableHLO uses since 2024.
inline std::string i64_array(const dims_t& v) { return v.empty() ? "array<i64>" : "array<i64: " + list(v) + ">"; }

/// An MLIR float literal that round-trips an f32 (the grammar needs a '.': "1.0e+00", not "1e+00").
/// Infinities and NaN have no decimal literal: MLIR takes the f32's bits in hex ("0xFF800000" is
/// -inf), as JAX writes a max reduction's initial value.
inline std::string float_literal(double v) {
    char buf[40];
    if (std::isfinite(v)) std::snprintf(buf, sizeof buf, "%.9e", v);
    else std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(std::bit_cast<std::uint32_t>(static_cast<float>(v))));
    return buf;
}

inline std::string types_of(const std::vector<value>& values) {
    std::string s;
    for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + values[i].type.str();
    return s;
}

inline std::string names_of(const std::vector<value>& values) {
    std::string s;
    for (std::size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + values[i].name;
    return s;
}

inline std::string_view direction_name(compare_direction d) {
    constexpr std::string_view names[] = {"EQ", "NE", "GE", "GT", "LE", "LT"};
    return names[static_cast<int>(d)];
}

}  // namespace detail

/// Builds the body of `func.func public @main` (and the regions nested in it). Every op returns a
/// fresh SSA value; operand shapes are checked so a bad module fails here with olmax::shape_error
/// naming the op, not later inside the plugin.
class function_builder {
public:
    explicit function_builder(std::vector<tensor_type> inputs) {
        for (std::size_t i = 0; i < inputs.size(); ++i) args_.push_back({"%arg" + std::to_string(i), std::move(inputs[i])});
    }

    const std::vector<value>& args() const { return args_; }
    const value& arg(std::size_t i) const { return args_.at(i); }

    /// Donates argument `arg` to result `result` (`tf.aliasing_output`, an input-output alias in XLA):
    /// the result is written into the argument's device buffer, which the execution consumes.
    void alias_output(std::size_t arg, std::size_t result) {
        check<shape_error>(arg < args_.size(), "stablehlo: alias_output: no argument ", arg, " (", args_.size(), " arguments)");
        aliases_.resize(args_.size(), -1);
        aliases_[arg] = static_cast<std::int64_t>(result);
    }

    /// Marks the module for XLA's SPMD partitioner over `partitions` devices: arguments flagged in
    /// `split_leading` are sharded along their first axis (`mhlo.sharding = "{devices=[P,1,...]0,...}"`),
    /// the others and all results replicated; the partitioner inserts the collectives.
    void partition(std::size_t partitions, std::vector<bool> split_leading) {
        check<shape_error>(partitions >= 1 && split_leading.size() <= args_.size(), "stablehlo: partition: ", partitions, " partitions, ",
                           split_leading.size(), " flags for ", args_.size(), " arguments");
        for (std::size_t i = 0; i < split_leading.size(); ++i)
            check<shape_error>(!split_leading[i] || (args_[i].type.rank() >= 1 && args_[i].type.dims[0] % std::int64_t(partitions) == 0),
                               "stablehlo: partition: argument ", i, " (", args_[i].type.str(), ") does not split into ", partitions,
                               " equal shares along its first axis");
        partitions_ = partitions;
        split_leading_ = std::move(split_leading);
    }

    /// The whole module text with `results` returned from @main.
    std::string finish(std::string_view module_name, const std::vector<value>& results) {
        std::ostringstream m;
        const bool partitioned = partitions_ > 1;
        m << "module @" << module_name;
        if (partitioned) m << " attributes {mhlo.num_partitions = " << partitions_ << " : i32, mhlo.num_replicas = 1 : i32}";
        m << " {\n  func.func public @main(";
        for (std::size_t i = 0; i < args_.size(); ++i) {
            m << (i ? ", " : "") << args_[i].name << ": " << args_[i].type.str();
            std::vector<std::string> attributes;
            if (i < aliases_.size() && aliases_[i] >= 0) {
                check<shape_error>(std::size_t(aliases_[i]) < results.size() && results[std::size_t(aliases_[i])].type == args_[i].type,
                                   "stablehlo: argument ", i, " (", args_[i].type.str(), ") is donated to result ", aliases_[i],
                                   ", which is not a result of that type");
                attributes.push_back("tf.aliasing_output = " + std::to_string(aliases_[i]) + " : i32");
            }
            if (partitioned) attributes.push_back(sharding_attribute(i < split_leading_.size() && split_leading_[i], args_[i].type.rank()));
            for (std::size_t k = 0; k < attributes.size(); ++k) m << (k ? ", " : " {") << attributes[k] << (k + 1 == attributes.size() ? "}" : "");
        }
        m << ") -> (";
        for (std::size_t i = 0; i < results.size(); ++i)
            m << (i ? ", " : "") << results[i].type.str() << (partitioned ? " {" + sharding_attribute(false, 0) + "}" : "");
        m << ") {\n" << body_.str();
        m << "    \"func.return\"(" << detail::names_of(results) << ") : (" << detail::types_of(results) << ") -> ()\n  }\n}\n";
        return m.str();
    }

    // ---- constants and index helpers ----------------------------------------------------------
    value constant(double v, tensor_type type) {
        const std::string literal = type.elem == element::f32 ? detail::float_literal(v)
                                    : type.elem == element::i1 ? std::string(v != 0 ? "true" : "false")
                                                               : std::to_string(static_cast<std::int64_t>(v));
        return emit("\"stablehlo.constant\"() {value = dense<" + literal + "> : " + type.str() + "}", {}, type, true);
    }
    value scalar(double v, element e = element::f32) { return constant(v, {{}, e}); }
    /// An f32 constant holding `values` (row-major), written as the bytes of the little-endian
    /// floats (MLIR's hex form of a dense attribute): exact, and one token however large.
    value dense_constant(const std::vector<float>& values, tensor_type type) {
        check<shape_error>(type.elem == element::f32 && std::int64_t(values.size()) == type.elements(), "stablehlo: a dense constant of ",
                           values.size(), " values for ", type.str());
        static constexpr char hex[] = "0123456789ABCDEF";
        std::string literal = "\"0x";
        for (float v : values) {
            unsigned char bytes[sizeof(float)];
            std::memcpy(bytes, &v, sizeof v);
            for (std::size_t i = 0; i < sizeof v; ++i) {  // little-endian: least significant byte first
                const unsigned char byte = bytes[std::endian::native == std::endian::little ? i : sizeof v - 1 - i];
                literal += hex[byte >> 4];
                literal += hex[byte & 15];
            }
        }
        literal += "\"";
        return emit("\"stablehlo.constant\"() {value = dense<" + literal + "> : " + type.str() + "}", {}, type, true);
    }
    value iota(tensor_type type, std::int64_t dimension) {
        check_dim("iota", type, dimension);
        return emit("\"stablehlo.iota\"() {iota_dimension = " + std::to_string(dimension) + " : i64}", {}, type, true);
    }

    // ---- element-wise ---------------------------------------------------------------------------
    /// Any same-shape binary op: add, subtract, multiply, divide, maximum, minimum, power, and, or.
    value binary(std::string_view op, const value& a, const value& b) {
        same_type(op, a, b);
        return emit(quoted(op), {a, b}, a.type);
    }
    value add(const value& a, const value& b) { return binary("add", a, b); }
    value sub(const value& a, const value& b) { return binary("subtract", a, b); }
    value mul(const value& a, const value& b) { return binary("multiply", a, b); }
    /// Any same-shape unary op: negate, exponential, log, tanh, sqrt, abs, logistic, ...
    value unary(std::string_view op, const value& x) { return emit(quoted(op), {x}, x.type); }
    value compare(const value& a, const value& b, compare_direction d) {
        same_type("compare", a, b);
        return emit("\"stablehlo.compare\"(" + a.name + ", " + b.name + ") {comparison_direction = #stablehlo<comparison_direction " +
                        std::string(detail::direction_name(d)) + ">}",
                    {a, b}, {a.type.dims, element::i1}, /*operands_written=*/true);
    }
    value convert(const value& x, element to) { return emit("\"stablehlo.convert\"", {x}, {x.type.dims, to}); }
    value select(const value& pred, const value& on_true, const value& on_false) {
        same_type("select", on_true, on_false);
        check<shape_error>(pred.type.dims == on_true.type.dims && pred.type.elem == element::i1, "stablehlo.select: predicate ",
                           pred.type.str(), " does not match ", on_true.type.str());
        return emit("\"stablehlo.select\"", {pred, on_true, on_false}, on_true.type);
    }

    // ---- shape ops ------------------------------------------------------------------------------
    value reshape(const value& x, dims_t dims) {
        tensor_type t{std::move(dims), x.type.elem};
        check<shape_error>(t.elements() == x.type.elements(), "stablehlo.reshape: ", x.type.str(), " to ", t.str(), " changes the size");
        return emit("\"stablehlo.reshape\"", {x}, t);
    }
    value transpose(const value& x, const dims_t& permutation) {
        check<shape_error>(permutation.size() == x.type.rank(), "stablehlo.transpose: permutation of ", permutation.size(), " for ", x.type.str());
        tensor_type t{{}, x.type.elem};
        for (auto p : permutation) t.dims.push_back(x.type.dims.at(static_cast<std::size_t>(p)));
        return emit_attr("\"stablehlo.transpose\"", {x}, "permutation = " + detail::i64_array(permutation), t);
    }
    value broadcast_in_dim(const value& x, dims_t out_dims, const dims_t& broadcast_dimensions) {
        check<shape_error>(broadcast_dimensions.size() == x.type.rank(), "stablehlo.broadcast_in_dim: ", broadcast_dimensions.size(),
                           " broadcast dimensions for ", x.type.str());
        for (std::size_t i = 0; i < broadcast_dimensions.size(); ++i) {
            const auto d = broadcast_dimensions[i];
            check<shape_error>(d >= 0 && d < static_cast<std::int64_t>(out_dims.size()) &&
                                   (x.type.dims[i] == 1 || x.type.dims[i] == out_dims[static_cast<std::size_t>(d)]),
                               "stablehlo.broadcast_in_dim: ", x.type.str(), " does not broadcast to ", tensor_type{out_dims}.str());
        }
        return emit_attr("\"stablehlo.broadcast_in_dim\"", {x}, "broadcast_dimensions = " + detail::i64_array(broadcast_dimensions),
                         {std::move(out_dims), x.type.elem});
    }
    value slice(const value& x, const dims_t& start, const dims_t& limit, dims_t strides = {}) {
        if (strides.empty()) strides.assign(x.type.rank(), 1);
        check<shape_error>(start.size() == x.type.rank() && limit.size() == x.type.rank() && strides.size() == x.type.rank(),
                           "stablehlo.slice: index rank does not match ", x.type.str());
        tensor_type t{{}, x.type.elem};
        for (std::size_t i = 0; i < start.size(); ++i) {
            check<shape_error>(0 <= start[i] && start[i] <= limit[i] && limit[i] <= x.type.dims[i], "stablehlo.slice: [", start[i], ", ",
                               limit[i], ") out of range for dimension ", i, " of ", x.type.str());
            t.dims.push_back((limit[i] - start[i] + strides[i] - 1) / strides[i]);
        }
        return emit_attr("\"stablehlo.slice\"", {x},
                         "start_indices = " + detail::i64_array(start) + ", limit_indices = " + detail::i64_array(limit) +
                             ", strides = " + detail::i64_array(strides),
                         t);
    }
    /// Edge padding (negative values crop) with a scalar fill value, no interior padding.
    value pad(const value& x, double fill, const dims_t& low, const dims_t& high) {
        check<shape_error>(low.size() == x.type.rank() && high.size() == x.type.rank(), "stablehlo.pad: padding rank does not match ", x.type.str());
        tensor_type t{{}, x.type.elem};
        for (std::size_t i = 0; i < low.size(); ++i) {
            t.dims.push_back(x.type.dims[i] + low[i] + high[i]);
            check<shape_error>(t.dims.back() >= 0 && x.type.dims[i] + low[i] >= 0, "stablehlo.pad: padding (", low[i], ", ", high[i],
                               ") empties dimension ", i, " of ", x.type.str());
        }
        const value f = scalar(fill, x.type.elem);
        return emit_attr("\"stablehlo.pad\"", {x, f},
                         "edge_padding_low = " + detail::i64_array(low) + ", edge_padding_high = " + detail::i64_array(high) +
                             ", interior_padding = " + detail::i64_array(dims_t(x.type.rank(), 0)),
                         t);
    }
    value concatenate(const std::vector<value>& parts, std::int64_t dimension) {
        check<shape_error>(!parts.empty(), "stablehlo.concatenate: no operands");
        tensor_type t = parts[0].type;
        check_dim("concatenate", t, dimension);
        const auto d = static_cast<std::size_t>(dimension);
        t.dims[d] = 0;
        for (const auto& p : parts) {
            check<shape_error>(p.type.rank() == t.rank(), "stablehlo.concatenate: ranks differ: ", p.type.str(), " and ", parts[0].type.str());
            for (std::size_t i = 0; i < t.rank(); ++i)
                check<shape_error>(i == d || p.type.dims[i] == parts[0].type.dims[i], "stablehlo.concatenate: ", p.type.str(), " and ",
                                   parts[0].type.str(), " differ outside dimension ", d);
            t.dims[d] += p.type.dims[d];
        }
        return emit_attr("\"stablehlo.concatenate\"", parts, "dimension = " + std::to_string(dimension) + " : i64", t);
    }
    value reverse(const value& x, const dims_t& dimensions) {
        return emit_attr("\"stablehlo.reverse\"", {x}, "dimensions = " + detail::i64_array(dimensions), x.type);
    }
    /// Slice of `sizes` starting at the 0-d i32 `indices` (one per dimension; clamped into range by XLA).
    value dynamic_slice(const value& x, const std::vector<value>& indices, const dims_t& sizes) {
        check<shape_error>(indices.size() == x.type.rank() && sizes.size() == x.type.rank(), "stablehlo.dynamic_slice: ", indices.size(),
                           " indices for ", x.type.str());
        std::vector<value> operands{x};
        operands.insert(operands.end(), indices.begin(), indices.end());
        return emit_attr("\"stablehlo.dynamic_slice\"", operands, "slice_sizes = " + detail::i64_array(sizes), {sizes, x.type.elem});
    }
    value dynamic_update_slice(const value& x, const value& update, const std::vector<value>& indices) {
        check<shape_error>(indices.size() == x.type.rank() && update.type.rank() == x.type.rank(), "stablehlo.dynamic_update_slice: ",
                           update.type.str(), " into ", x.type.str());
        std::vector<value> operands{x, update};
        operands.insert(operands.end(), indices.begin(), indices.end());
        return emit("\"stablehlo.dynamic_update_slice\"", operands, x.type);
    }
    /// An i32 scalar: a loop counter, a dynamic slice's start.
    value index(std::int64_t v) { return scalar(double(v), element::i32); }
    /// x[..., i, ...]: dimension `axis` taken at the 0-d i32 index `i` and dropped (a layer of a
    /// stacked [depth, ...] tensor, a time step of [B, T, ...]).
    value dynamic_index(const value& x, std::size_t axis, const value& i) {
        check<shape_error>(axis < x.type.rank(), "stablehlo.dynamic_slice: axis ", axis, " of ", x.type.str());
        std::vector<value> start(x.type.rank(), index(0));
        start[axis] = i;
        dims_t sizes = x.type.dims, kept = x.type.dims;
        sizes[axis] = 1;
        kept.erase(kept.begin() + std::ptrdiff_t(axis));
        return reshape(dynamic_slice(x, start, sizes), kept);
    }
    /// x with x[..., i, ...] along `axis` replaced by `part` (x's type without that dimension).
    value dynamic_index_update(const value& x, std::size_t axis, const value& part, const value& i) {
        check<shape_error>(axis < x.type.rank() && part.type.rank() + 1 == x.type.rank(), "stablehlo.dynamic_update_slice: ", part.type.str(),
                           " into ", x.type.str(), " at axis ", axis);
        std::vector<value> start(x.type.rank(), index(0));
        start[axis] = i;
        dims_t one = part.type.dims;
        one.insert(one.begin() + std::ptrdiff_t(axis), 1);
        return dynamic_update_slice(x, reshape(part, one), start);
    }

    // ---- contractions and reductions ------------------------------------------------------------
    /// General dot: result dims = batch dims, lhs free dims, rhs free dims. Always HIGHEST precision.
    /// The result's element type is the operands' unless `result` says otherwise (bf16 x bf16 -> f32:
    /// products of bf16 values summed in f32, what bf16 matrix units compute).
    value dot_general(const value& lhs, const value& rhs, const dims_t& lhs_batch, const dims_t& rhs_batch, const dims_t& lhs_contract,
                      const dims_t& rhs_contract, std::optional<element> result = std::nullopt) {
        check<shape_error>(lhs.type.elem == rhs.type.elem, "stablehlo.dot_general: operand element types differ: ", lhs.type.str(), " x ",
                           rhs.type.str());
        check<shape_error>(lhs_batch.size() == rhs_batch.size() && lhs_contract.size() == rhs_contract.size(),
                           "stablehlo.dot_general: dimension lists differ in length");
        auto size_at = [](const value& v, std::int64_t d) {
            check<shape_error>(d >= 0 && d < static_cast<std::int64_t>(v.type.rank()), "stablehlo.dot_general: dimension ", d, " out of range for ",
                               v.type.str());
            return v.type.dims[static_cast<std::size_t>(d)];
        };
        for (std::size_t i = 0; i < lhs_batch.size(); ++i)
            check<shape_error>(size_at(lhs, lhs_batch[i]) == size_at(rhs, rhs_batch[i]), "stablehlo.dot_general: batch sizes differ: ",
                               lhs.type.str(), " x ", rhs.type.str());
        for (std::size_t i = 0; i < lhs_contract.size(); ++i)
            check<shape_error>(size_at(lhs, lhs_contract[i]) == size_at(rhs, rhs_contract[i]), "stablehlo.dot_general: contracting sizes differ: ",
                               lhs.type.str(), " x ", rhs.type.str());
        tensor_type t{{}, result.value_or(lhs.type.elem)};
        for (auto d : lhs_batch) t.dims.push_back(size_at(lhs, d));
        auto free_dims = [&](const value& v, const dims_t& batch, const dims_t& contract) {
            for (std::int64_t d = 0; d < static_cast<std::int64_t>(v.type.rank()); ++d) {
                bool used = false;
                for (auto b : batch) used |= b == d;
                for (auto c : contract) used |= c == d;
                if (!used) t.dims.push_back(v.type.dims[static_cast<std::size_t>(d)]);
            }
        };
        free_dims(lhs, lhs_batch, lhs_contract);
        free_dims(rhs, rhs_batch, rhs_contract);
        const std::string attrs = "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [" + detail::list(lhs_batch) +
                                  "], rhs_batching_dimensions = [" + detail::list(rhs_batch) + "], lhs_contracting_dimensions = [" +
                                  detail::list(lhs_contract) + "], rhs_contracting_dimensions = [" + detail::list(rhs_contract) +
                                  "]>, precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
        return emit_attr("\"stablehlo.dot_general\"", {lhs, rhs}, attrs, t);
    }

    /// Reduction over `dimensions` with a binary body op ("add" or "maximum") from `init`.
    value reduce(const value& x, double init, const dims_t& dimensions, std::string_view body_op) {
        tensor_type t{{}, x.type.elem};
        for (std::int64_t d = 0; d < static_cast<std::int64_t>(x.type.rank()); ++d) {
            bool reduced = false;
            for (auto r : dimensions) reduced |= r == d;
            if (!reduced) t.dims.push_back(x.type.dims[static_cast<std::size_t>(d)]);
        }
        for (auto r : dimensions) check_dim("reduce", x.type, r);
        const value init_value = scalar(init, x.type.elem);
        const std::string result = next_name();
        const tensor_type s{{}, x.type.elem};
        line(result + " = \"stablehlo.reduce\"(" + x.name + ", " + init_value.name + ") ({");
        scalar_combiner(body_op, s);
        line("}) {dimensions = " + detail::i64_array(dimensions) + "} : (" + x.type.str() + ", " + s.str() + ") -> " + t.str());
        return {result, t};
    }

    /// Rows of a matrix by index: out[m, :] = x[rows[m], :] for x [R, W] and i32 rows [M] (an index
    /// out of [0, R) is clamped into range, as StableHLO's gather does).
    value gather_rows(const value& x, const value& rows) {
        check<shape_error>(x.type.rank() == 2 && rows.type.rank() == 1 && rows.type.elem == element::i32, "stablehlo.gather: rows of ",
                           x.type.str(), " by ", rows.type.str());
        const std::int64_t width = x.type.dims[1], count = rows.type.dims[0];
        const value index = reshape(rows, {count, 1});
        return emit_attr("\"stablehlo.gather\"", {x, index},
                         "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], "
                         "index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = " +
                             detail::i64_array({1, width}),
                         f32({count, width}));
    }
    /// The adjoint of gather_rows: `into` [R, W] with src[m, :] added to row rows[m] for every m
    /// (i32 rows [M], src [M, W]; an index out of [0, R) is skipped, as StableHLO's scatter does).
    value scatter_add_rows(const value& into, const value& rows, const value& src) {
        check<shape_error>(into.type.rank() == 2 && src.type.rank() == 2 && rows.type.rank() == 1 && rows.type.elem == element::i32 &&
                               src.type.dims[0] == rows.type.dims[0] && src.type.dims[1] == into.type.dims[1],
                           "stablehlo.scatter: ", src.type.str(), " by ", rows.type.str(), " into ", into.type.str());
        const value index = reshape(rows, {rows.type.dims[0], 1});
        const std::string result = next_name();
        const tensor_type s{{}, into.type.elem};
        line(result + " = \"stablehlo.scatter\"(" + into.name + ", " + index.name + ", " + src.name + ") ({");
        scalar_combiner("add", s);
        line("}) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
             "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : (" +
             into.type.str() + ", " + index.type.str() + ", " + src.type.str() + ") -> " + into.type.str());
        return {result, into.type};
    }

    /// Sum of x over the replicas 0 .. replicas-1 of a replicated program (one replica group);
    /// every replica receives the sum.
    value all_reduce_sum(const value& x, std::int64_t replicas) {
        check<value_error>(replicas >= 1, "stablehlo.all_reduce: replicas must be positive, got ", replicas);
        const tensor_type s{{}, x.type.elem};
        const std::string result = next_name();
        line(result + " = \"stablehlo.all_reduce\"(" + x.name + ") ({");
        scalar_combiner("add", s);
        dims_t group;
        for (std::int64_t i = 0; i < replicas; ++i) group.push_back(i);
        line("}) {replica_groups = dense<[[" + detail::list(group) + "]]> : tensor<1x" + std::to_string(replicas) + "xi64>} : (" +
             x.type.str() + ") -> " + x.type.str());
        return {result, x.type};
    }

    /// A call of a function the plugin has registered under `target` with XLA's typed FFI
    /// (api_version 4), whose results have `results`' types. `attributes` are i64 values the handler
    /// receives by name. Every operand and result is laid out row-major (the handler reads plain
    /// dense buffers). The program then compiles only on a plugin that has `target` registered.
    std::vector<value> custom_call(std::string_view target, const std::vector<value>& operands, const std::vector<tensor_type>& results,
                                   const std::vector<std::pair<std::string, std::int64_t>>& attributes = {}) {
        check<shape_error>(!results.empty(), "stablehlo.custom_call @", target, ": no results");
        auto layouts = [](auto&& types) {
            std::string text = "[";
            for (std::size_t i = 0; i < types.size(); ++i) {
                const std::size_t rank = types[i].rank();
                text += i ? ", dense<[" : "dense<[";
                for (std::size_t d = 0; d < rank; ++d) text += (d ? ", " : "") + std::to_string(rank - 1 - d);
                text += "]> : tensor<" + std::to_string(rank) + "xindex>";
            }
            return text + "]";
        };
        std::vector<tensor_type> operand_types;
        for (const auto& v : operands) operand_types.push_back(v.type);
        std::string config = "{";
        for (std::size_t i = 0; i < attributes.size(); ++i)
            config += (i ? ", " : "") + attributes[i].first + " = " + std::to_string(attributes[i].second) + " : i64";
        config += "}";
        std::string result_types;
        for (std::size_t i = 0; i < results.size(); ++i) result_types += (i ? ", " : "") + results[i].str();
        const std::string result = next_name();
        line(result + ":" + std::to_string(results.size()) + " = \"stablehlo.custom_call\"(" + detail::names_of(operands) +
             ") {api_version = 4 : i32, backend_config = " + config + ", call_target_name = \"" + std::string(target) +
             "\", operand_layouts = " + layouts(operand_types) + ", result_layouts = " + layouts(results) + "} : (" +
             detail::types_of(operands) + ") -> (" + result_types + ")");
        std::vector<value> out;
        for (std::size_t i = 0; i < results.size(); ++i) out.push_back({result + "#" + std::to_string(i), results[i]});
        return out;
    }

    /// `stablehlo.while`: `cond(carry) -> tensor<i1>`, `body(carry) -> new carry`. Regions see only
    /// their block arguments (outer values are carried in, as the reference advises for XLA).
    std::vector<value> while_loop(const std::vector<value>& init, const std::function<value(function_builder&, const std::vector<value>&)>& cond,
                                  const std::function<std::vector<value>(function_builder&, const std::vector<value>&)>& body) {
        const std::string result = next_name();
        const std::string types = detail::types_of(init);
        line(result + ":" + std::to_string(init.size()) + " = \"stablehlo.while\"(" + detail::names_of(init) + ") ({");
        auto region = [&](auto&& fill) {
            std::vector<value> carry;
            std::string header = "^bb0(";
            for (std::size_t i = 0; i < init.size(); ++i) {
                carry.push_back({next_block_arg(), init[i].type});
                header += (i ? ", " : "") + carry.back().name + ": " + init[i].type.str();
            }
            line(header + "):");
            ++depth_;
            const std::vector<value> out = fill(carry);
            line("\"stablehlo.return\"(" + detail::names_of(out) + ") : (" + detail::types_of(out) + ") -> ()");
            --depth_;
        };
        region([&](const std::vector<value>& carry) {
            const value c = cond(*this, carry);
            check<shape_error>(c.type == tensor_type{{}, element::i1}, "stablehlo.while: condition must be tensor<i1>, got ", c.type.str());
            return std::vector<value>{c};
        });
        line("}, {");
        region([&](const std::vector<value>& carry) {
            std::vector<value> out = body(*this, carry);
            check<shape_error>(detail::types_of(out) == types, "stablehlo.while: body returns (", detail::types_of(out), "), carry is (", types, ")");
            return out;
        });
        line("}) : (" + types + ") -> (" + types + ")");
        std::vector<value> results;
        for (std::size_t i = 0; i < init.size(); ++i) results.push_back({result + "#" + std::to_string(i), init[i].type});
        return results;
    }

private:
    /// GSPMD's sharding of a value: "{replicated}", or split along the first axis over every
    /// partition in order ("{devices=[P,1,...]0,1,...,P-1}": a tile count per dimension, then the
    /// devices holding the tiles).
    std::string sharding_attribute(bool split, std::size_t rank) const {
        if (!split) return "mhlo.sharding = \"{replicated}\"";
        // Appended piece by piece: GCC 12 misreads `"literal" + std::string&&` here as a memcpy of
        // negative size once inlined (-Warray-bounds, a false positive).
        std::string s = "mhlo.sharding = \"{devices=[";
        s += std::to_string(partitions_);
        for (std::size_t d = 1; d < rank; ++d) s += ",1";
        s += "]";
        for (std::size_t p = 0; p < partitions_; ++p) {
            if (p) s += ",";
            s += std::to_string(p);
        }
        s += "}\"";
        return s;
    }

    static std::string quoted(std::string_view op) { return "\"stablehlo." + std::string(op) + "\""; }
    /// The region of a reduction-like op (reduce, all_reduce, scatter): ^bb0(a, b) returning the
    /// scalar `a body_op b` of type `s`.
    void scalar_combiner(std::string_view body_op, const tensor_type& s) {
        const value a{next_block_arg(), s}, b{next_block_arg(), s};
        line("^bb0(" + a.name + ": " + s.str() + ", " + b.name + ": " + s.str() + "):");
        ++depth_;
        const value r = binary(body_op, a, b);
        line("\"stablehlo.return\"(" + r.name + ") : (" + s.str() + ") -> ()");
        --depth_;
    }

    static void same_type(std::string_view op, const value& a, const value& b) {
        check<shape_error>(a.type == b.type, "stablehlo.", op, ": operand types differ: ", a.type.str(), " and ", b.type.str());
    }
    static void check_dim(std::string_view op, const tensor_type& t, std::int64_t d) {
        check<shape_error>(d >= 0 && d < static_cast<std::int64_t>(t.rank()), "stablehlo.", op, ": dimension ", d, " out of range for ", t.str());
    }

    std::string next_name() { return "%" + std::to_string(counter_++); }
    std::string next_block_arg() { return "%b" + std::to_string(counter_++); }

    void line(const std::string& text) { body_ << std::string(static_cast<std::size_t>(4 + 2 * depth_), ' ') << text << "\n"; }

    value emit(const std::string& op, const std::vector<value>& operands, tensor_type result, bool operands_written = false) {
        const std::string name = next_name();
        std::string text = name + " = " + op;
        if (!operands_written) text += "(" + detail::names_of(operands) + ")";
        line(text + " : (" + detail::types_of(operands) + ") -> " + result.str());
        return {name, std::move(result)};
    }
    value emit_attr(const std::string& op, const std::vector<value>& operands, const std::string& attrs, tensor_type result) {
        return emit(op + "(" + detail::names_of(operands) + ") {" + attrs + "}", operands, std::move(result), true);
    }

    std::vector<value> args_;
    std::size_t partitions_ = 1;
    std::vector<bool> split_leading_;
    std::vector<std::int64_t> aliases_;  // per argument: the result it is donated to, or -1
    std::ostringstream body_;
    int depth_ = 0;
    int counter_ = 0;
};

}  // namespace olmax::xla::stablehlo
