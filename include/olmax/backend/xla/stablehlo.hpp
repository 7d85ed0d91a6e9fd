#pragma once
// StableHLO text emitter: builds MLIR modules in the *generic* op form (`"stablehlo.add"(%a, %b) :
// (...) -> ...`), which is what a PJRT plugin's `"mlir"` program format parses. Pure C++, no
// dependency; static shapes, f32 data, i32 indices, `precision = HIGHEST` on every dot_general (the
// default is one bf16 pass on TPU and TF32 on NVIDIA). Reference: docs/xla.md and
// openxla/stablehlo docs/spec.md for the op semantics.
//
// Two layers: `function_builder` (one SSA value per op, regions for while/reduce) and the module
// library below it (`scan_forward`, `scan_backward`, `matmul`, `qrnn_block_forward`, ...), each
// returning an `emitted_module` with a cache key naming the op and the shapes.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "olmax/core/error.hpp"

namespace olmax::xla::stablehlo {

enum class element { f32, i32, i1 };

inline std::string_view element_name(element e) {
    switch (e) {
        case element::f32: return "f32";
        case element::i32: return "i32";
        case element::i1: return "i1";
    }
    return "?";
}

using dims_t = std::vector<std::int64_t>;

/// A ranked tensor type with static dimensions: `tensor<4x128xf32>`, `tensor<i32>` for a scalar.
struct tensor_type {
    dims_t dims;
    element elem = element::f32;

    std::size_t rank() const { return dims.size(); }
    std::int64_t elements() const {
        std::int64_t n = 1;
        for (auto d : dims) n *= d;
        return n;
    }
    std::string str() const {
        std::string s = "tensor<";
        for (auto d : dims) s += std::to_string(d) + "x";
        s += element_name(elem);
        return s + ">";
    }
    bool operator==(const tensor_type&) const = default;
};

inline tensor_type f32(dims_t dims) { return {std::move(dims), element::f32}; }

/// An SSA value of the function being built: its name (`%12`, `%arg0`, `%7#1`) and type.
struct value {
    std::string name;
    tensor_type type;
};

/// Comparison directions of `stablehlo.compare`.
enum class compare_direction { EQ, NE, GE, GT, LE, LT };

namespace detail {

inline std::string list(const dims_t& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s;
}

/// `array<i64: 1, 2>` (or `array<i64>` when empty): the attribute syntax StableHLO uses since 2024.
inline std::string i64_array(const dims_t& v) { return v.empty() ? "array<i64>" : "array<i64: " + list(v) + ">"; }

/// An MLIR float literal that round-trips an f32 (the grammar needs a '.': "1.0e+00", not "1e+00").
inline std::string float_literal(double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9e", v);
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

    /// The whole module text with `results` returned from @main.
    std::string finish(std::string_view module_name, const std::vector<value>& results) {
        std::ostringstream m;
        m << "module @" << module_name << " {\n  func.func public @main(";
        for (std::size_t i = 0; i < args_.size(); ++i) m << (i ? ", " : "") << args_[i].name << ": " << args_[i].type.str();
        m << ") -> (" << detail::types_of(results) << ") {\n" << body_.str();
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
    value div(const value& a, const value& b) { return binary("divide", a, b); }
    value max(const value& a, const value& b) { return binary("maximum", a, b); }
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
    /// clamp(lo, x, hi) with scalar bounds.
    value clamp(double lo, const value& x, double hi) {
        const value l = scalar(lo, x.type.elem), h = scalar(hi, x.type.elem);
        return emit("\"stablehlo.clamp\"", {l, x, h}, x.type);
    }
    /// x op c for a scalar constant c broadcast to x's shape.
    value with_constant(std::string_view op, const value& x, double c) { return binary(op, x, constant(c, x.type)); }

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

    // ---- contractions and reductions ------------------------------------------------------------
    /// General dot: result dims = batch dims, lhs free dims, rhs free dims. Always HIGHEST precision.
    value dot_general(const value& lhs, const value& rhs, const dims_t& lhs_batch, const dims_t& rhs_batch, const dims_t& lhs_contract,
                      const dims_t& rhs_contract) {
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
        tensor_type t{{}, lhs.type.elem};
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
        const value a{next_block_arg(), s}, b{next_block_arg(), s};
        line("^bb0(" + a.name + ": " + s.str() + ", " + b.name + ": " + s.str() + "):");
        ++depth_;
        const value r = binary(body_op, a, b);
        line("\"stablehlo.return\"(" + r.name + ") : (" + s.str() + ") -> ()");
        --depth_;
        line("}) {dimensions = " + detail::i64_array(dimensions) + "} : (" + x.type.str() + ", " + s.str() + ") -> " + t.str());
        return {result, t};
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
    static std::string quoted(std::string_view op) { return "\"stablehlo." + std::string(op) + "\""; }

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
    std::ostringstream body_;
    int depth_ = 0;
    int counter_ = 0;
};

// =================================================================================================
// Module library
// =================================================================================================

/// One emitted module: its cache key (op + shapes), text, and the types of its inputs and outputs.
struct emitted_module {
    std::string key;
    std::string text;
    std::vector<tensor_type> inputs;
    std::vector<tensor_type> outputs;
};

/// How the linear recurrence h_t = a_t h_{t-1} + x_t is lowered.
struct scan_strategy {
    enum class kind { sequential, hillis_steele, chunked_matmul };
    kind strategy = kind::chunked_matmul;
    std::int64_t chunk = 128;  // chunked_matmul only: the width of the per-chunk triangular matrix

    static scan_strategy sequential() { return {kind::sequential, 0}; }
    static scan_strategy hillis_steele() { return {kind::hillis_steele, 0}; }
    template <std::int64_t Chunk = 128>
    static scan_strategy chunked_matmul() {
        static_assert(Chunk >= 1, "chunked_matmul: chunk must be positive");
        return {kind::chunked_matmul, Chunk};
    }
    std::string name() const {
        switch (strategy) {
            case kind::sequential: return "sequential";
            case kind::hillis_steele: return "hillis_steele";
            case kind::chunked_matmul: return "chunked_matmul" + std::to_string(chunk);
        }
        return "?";
    }
};

namespace detail {

inline std::int64_t ceil_log2(std::int64_t n) {
    std::int64_t steps = 0;
    while ((std::int64_t{1} << steps) < n) ++steps;
    return steps;
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

/// Sequential scan as a stablehlo.while over time: carry (k, h, out, a, x); one step per iteration.
inline value sequential_scan(function_builder& b, const value& a, const value& x) {
    const std::int64_t rows = x.type.dims[0], steps = x.type.dims[1];
    const value k0 = b.scalar(0, element::i32);
    const value h0 = b.constant(0.0, f32({rows}));
    const value out0 = b.constant(0.0, x.type);
    const auto results = b.while_loop(
        {k0, h0, out0, a, x},
        [steps](function_builder& r, const std::vector<value>& c) {
            return r.compare(c[0], r.scalar(static_cast<double>(steps), element::i32), compare_direction::LT);
        },
        [rows](function_builder& r, const std::vector<value>& c) {
            const value zero = r.scalar(0, element::i32);
            const value ak = r.reshape(r.dynamic_slice(c[3], {zero, c[0]}, {rows, 1}), {rows});
            const value xk = r.reshape(r.dynamic_slice(c[4], {zero, c[0]}, {rows, 1}), {rows});
            const value h = r.add(r.mul(ak, c[1]), xk);
            const value out = r.dynamic_update_slice(c[2], r.reshape(h, {rows, 1}), {zero, c[0]});
            const value next = r.add(c[0], r.scalar(1, element::i32));
            return std::vector<value>{next, h, out, c[3], c[4]};
        });
    return results[2];
}

/// Chunked scan with per-chunk lower-triangular transfer matrices on the matrix unit:
///   A_c[i, j] = prod_{k=j+1..i} a_k (i >= j, else 0), built by a log-depth row-wise cumulative
///   product (never exp of log-gates: log 0 = -inf, nor P_i / P_j: underflow), then
///   h_local = A_c x_c by a batched dot_general; chunk summaries (P_last, h_local_last) are scanned
///   across chunks (Hillis–Steele) and fixed up: h = h_local + P * H_{c-1}.
inline value chunked_matmul_scan(function_builder& b, value a, value x, std::int64_t chunk) {
    const std::int64_t rows = x.type.dims[0], steps = x.type.dims[1];
    const std::int64_t chunks = (steps + chunk - 1) / chunk, padded = chunks * chunk;
    if (padded != steps) {  // pad on the host side of time: later steps never affect earlier ones
        a = b.pad(a, 1.0, {0, 0}, {0, padded - steps});
        x = b.pad(x, 0.0, {0, 0}, {0, padded - steps});
    }
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
    return padded == steps ? x : b.slice(x, {0, 0}, {rows, steps});
}

}  // namespace detail

/// Inclusive scan h_t = a_t h_{t-1} + x_t from a zero state along dimension 1 of [rows, T] values.
inline value emit_scan(function_builder& b, const scan_strategy& strategy, const value& a, const value& x) {
    check<shape_error>(a.type == x.type && x.type.rank() == 2, "scan: gates ", a.type.str(), " and inputs ", x.type.str(),
                       " must both be [rows, T]");
    switch (strategy.strategy) {
        case scan_strategy::kind::sequential: return detail::sequential_scan(b, a, x);
        case scan_strategy::kind::hillis_steele: return detail::hillis_steele(b, a, x, 1);
        case scan_strategy::kind::chunked_matmul:
            check<value_error>(strategy.chunk >= 1, "scan: chunked_matmul chunk must be positive, got ", strategy.chunk);
            return detail::chunked_matmul_scan(b, a, x, strategy.chunk);
    }
    return x;
}

/// Reverse-time adjoint of the scan: delta_t = g_t + a_{t+1} delta_{t+1} (a reverse scan with the
/// gates shifted by one; scan-strategies.md §1).
inline value emit_reverse_adjoint(function_builder& b, const scan_strategy& strategy, const value& a, const value& g) {
    const value next_gate = b.pad(a, 0.0, {0, -1}, {0, 1});  // a_{t+1}, 0 after the end
    const value reversed = emit_scan(b, strategy, b.reverse(next_gate, {1}), b.reverse(g, {1}));
    return b.reverse(reversed, {1});
}

inline void check_scan_sizes(std::string_view op, std::int64_t rows, std::int64_t steps) {
    check<value_error>(rows >= 1 && steps >= 1, op, ": rows and T must be at least 1, got rows=", rows, " T=", steps);
}

/// (a [R,T], x [R,T], h0 [R]) -> h [R,T].
inline emitted_module scan_forward(const scan_strategy& strategy, std::int64_t rows, std::int64_t steps) {
    check_scan_sizes("scan_forward", rows, steps);
    const tensor_type rt = f32({rows, steps}), r = f32({rows});
    function_builder b({rt, rt, r});
    const value a = b.arg(0), h0 = b.arg(2);
    // Fold the initial state into the first input: h_0 = a_0 h0 + x_0.
    const value first = b.mul(b.reshape(b.slice(a, {0, 0}, {rows, 1}), {rows}), h0);
    const value x = b.add(b.arg(1), b.pad(b.reshape(first, {rows, 1}), 0.0, {0, 0}, {0, steps - 1}));
    const value h = emit_scan(b, strategy, a, x);
    const std::string key = "scan_forward." + strategy.name() + "." + std::to_string(rows) + "x" + std::to_string(steps);
    return {key, b.finish("scan_forward", {h}), {rt, rt, r}, {rt}};
}

/// (a [R,T], h [R,T], h0 [R], g [R,T]) -> (dx [R,T], da [R,T], dh0 [R]):
/// delta = reverse adjoint of g; dx = delta; da_t = delta_t h_{t-1} (h_{-1} = h0); dh0 = a_0 delta_0.
inline emitted_module scan_backward(const scan_strategy& strategy, std::int64_t rows, std::int64_t steps) {
    check_scan_sizes("scan_backward", rows, steps);
    const tensor_type rt = f32({rows, steps}), r = f32({rows});
    function_builder b({rt, rt, r, rt});
    const value a = b.arg(0), h = b.arg(1), h0 = b.arg(2), g = b.arg(3);
    const value delta = emit_reverse_adjoint(b, strategy, a, g);
    const value h0_column = b.reshape(h0, {rows, 1});
    const value previous = steps == 1 ? h0_column : b.concatenate({h0_column, b.slice(h, {0, 0}, {rows, steps - 1})}, 1);
    const value da = b.mul(delta, previous);
    const value dh0 = b.mul(b.reshape(b.slice(a, {0, 0}, {rows, 1}), {rows}), b.reshape(b.slice(delta, {0, 0}, {rows, 1}), {rows}));
    const std::string key = "scan_backward." + strategy.name() + "." + std::to_string(rows) + "x" + std::to_string(steps);
    return {key, b.finish("scan_backward", {delta, da, dh0}), {rt, rt, r, rt}, {rt, rt, r}};
}

/// C = op(A) op(B) with op = transpose when asked; A is [M,K] (or [K,M]), B is [K,N] (or [N,K]).
inline emitted_module matmul(std::int64_t m, std::int64_t k, std::int64_t n, bool transpose_a = false, bool transpose_b = false) {
    check<value_error>(m >= 1 && k >= 1 && n >= 1, "matmul: sizes must be at least 1, got m=", m, " k=", k, " n=", n);
    const tensor_type ta = transpose_a ? f32({k, m}) : f32({m, k});
    const tensor_type tb = transpose_b ? f32({n, k}) : f32({k, n});
    function_builder b({ta, tb});
    const value c = b.dot_general(b.arg(0), b.arg(1), {}, {}, {transpose_a ? 0 : 1}, {transpose_b ? 1 : 0});
    const std::string key = "matmul." + std::string(transpose_a ? "T" : "N") + (transpose_b ? "T" : "N") + "." + std::to_string(m) + "x" +
                            std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("matmul", {c}), {ta, tb}, {c.type}};
}

/// C[i] = A[i] B[i] for A [batch,M,K], B [batch,K,N].
inline emitted_module batched_matmul(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
    check<value_error>(batch >= 1 && m >= 1 && k >= 1 && n >= 1, "batched_matmul: sizes must be at least 1");
    const tensor_type ta = f32({batch, m, k}), tb = f32({batch, k, n});
    function_builder b({ta, tb});
    const value c = b.dot_general(b.arg(0), b.arg(1), {0}, {0}, {2}, {1});
    const std::string key = "batched_matmul." + std::to_string(batch) + "x" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("batched_matmul", {c}), {ta, tb}, {c.type}};
}

/// Gradients of C = A B: (A [M,K], B [K,N], dC [M,N]) -> (dA = dC B^T, dB = A^T dC).
inline emitted_module matmul_backward(std::int64_t m, std::int64_t k, std::int64_t n) {
    check<value_error>(m >= 1 && k >= 1 && n >= 1, "matmul_backward: sizes must be at least 1");
    const tensor_type ta = f32({m, k}), tb = f32({k, n}), tc = f32({m, n});
    function_builder b({ta, tb, tc});
    const value da = b.dot_general(b.arg(2), b.arg(1), {}, {}, {1}, {1});
    const value db = b.dot_general(b.arg(0), b.arg(2), {}, {}, {0}, {0});
    const std::string key = "matmul_backward." + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    return {key, b.finish("matmul_backward", {da, db}), {ta, tb, tc}, {ta, tb}};
}

inline std::string dims_key(const dims_t& dims) {
    std::string s;
    for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
    return s.empty() ? "scalar" : s;
}

/// y = op(x) for a StableHLO unary op name (negate, exponential, log, tanh, sqrt, abs, logistic, ...).
inline emitted_module elementwise_unary(std::string_view op, const dims_t& dims) {
    function_builder b({f32(dims)});
    const value y = b.unary(op, b.arg(0));
    return {"unary." + std::string(op) + "." + dims_key(dims), b.finish("unary", {y}), {f32(dims)}, {f32(dims)}};
}

/// z = op(x, y) for a StableHLO binary op name (add, subtract, multiply, divide, maximum, minimum, power).
inline emitted_module elementwise_binary(std::string_view op, const dims_t& dims) {
    function_builder b({f32(dims), f32(dims)});
    const value z = b.binary(op, b.arg(0), b.arg(1));
    return {"binary." + std::string(op) + "." + dims_key(dims), b.finish("binary", {z}), {f32(dims), f32(dims)}, {f32(dims)}};
}

enum class reduction_kind { sum, max };

/// Sum or max of x over `axes`.
inline emitted_module reduce(reduction_kind kind, const dims_t& dims, const dims_t& axes) {
    function_builder b({f32(dims)});
    const bool sum = kind == reduction_kind::sum;
    const value y = b.reduce(b.arg(0), sum ? 0.0 : -3.4028234663852886e38, axes, sum ? "add" : "maximum");
    const std::string key = std::string(sum ? "reduce_sum." : "reduce_max.") + dims_key(dims) + ".axes" + dims_key(axes);
    return {key, b.finish("reduce", {y}), {f32(dims)}, {y.type}};
}

namespace detail {

/// hard_sigmoid(a) = clip((a + 3) / 6, 0, 1).
inline value hard_sigmoid(function_builder& b, const value& a) {
    return b.clamp(0.0, b.with_constant("divide", b.with_constant("add", a, 3.0), 6.0), 1.0);
}

struct qrnn_forward_values {
    value z, gate_pre, forget, inputs, h;  // gate_pre/forget/inputs/h in [H, T] rows layout
};

/// z = u W; x, a = z[:, :H], z[:, H:]; f = hard_sigmoid(a); h_t = f_t h_{t-1} + x_t from h_{-1} = 0.
inline qrnn_forward_values qrnn_forward_values_of(function_builder& b, const scan_strategy& strategy, const value& u, const value& w) {
    const std::int64_t steps = u.type.dims[0], hidden = w.type.dims[1] / 2;
    const value z = b.dot_general(u, w, {}, {}, {1}, {0});  // [T, 2H]
    const value inputs = b.transpose(b.slice(z, {0, 0}, {steps, hidden}), {1, 0});
    const value gate_pre = b.transpose(b.slice(z, {0, hidden}, {steps, 2 * hidden}), {1, 0});
    const value forget = hard_sigmoid(b, gate_pre);
    return {z, gate_pre, forget, inputs, emit_scan(b, strategy, forget, inputs)};
}

inline void check_qrnn_sizes(std::string_view op, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    check<value_error>(steps >= 1 && features >= 1 && hidden >= 1, op, ": sizes must be at least 1, got T=", steps, " F=", features,
                       " H=", hidden);
}

}  // namespace detail

/// QRNN block forward: (u [T,F], W [F,2H]) -> h [T,H] with the hard-sigmoid forget gate
/// (olmax-techniques.md §7: h_t = f_t h_{t-1} + x_t, f = clip((a+3)/6, 0, 1)).
inline emitted_module qrnn_block_forward(const scan_strategy& strategy, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    detail::check_qrnn_sizes("qrnn_block_forward", steps, features, hidden);
    const tensor_type tu = f32({steps, features}), tw = f32({features, 2 * hidden});
    function_builder b({tu, tw});
    const auto v = detail::qrnn_forward_values_of(b, strategy, b.arg(0), b.arg(1));
    const value h = b.transpose(v.h, {1, 0});
    const std::string key = "qrnn_block_forward." + strategy.name() + "." + std::to_string(steps) + "x" + std::to_string(features) + "x" +
                            std::to_string(hidden);
    return {key, b.finish("qrnn_block_forward", {h}), {tu, tw}, {h.type}};
}

/// QRNN block backward with linear memory (the forward is recomputed from u and W):
/// (u [T,F], W [F,2H], dh [T,H]) -> (du [T,F], dW [F,2H]). delta = reverse adjoint of dh,
/// dx = delta, df_t = delta_t h_{t-1} (h_{-1} = 0; the original used h_t, a bug), da = df/6 inside (-3, 3).
inline emitted_module qrnn_block_backward(const scan_strategy& strategy, std::int64_t steps, std::int64_t features, std::int64_t hidden) {
    detail::check_qrnn_sizes("qrnn_block_backward", steps, features, hidden);
    const tensor_type tu = f32({steps, features}), tw = f32({features, 2 * hidden}), th = f32({steps, hidden});
    function_builder b({tu, tw, th});
    const value u = b.arg(0), w = b.arg(1);
    const auto v = detail::qrnn_forward_values_of(b, strategy, u, w);
    const value delta = emit_reverse_adjoint(b, strategy, v.forget, b.transpose(b.arg(2), {1, 0}));  // [H, T]
    const value previous = detail::shift_up(b, v.h, 1, 1, 0.0);
    const value dforget = b.mul(delta, previous);
    const value inside = b.binary("and", b.compare(v.gate_pre, b.constant(-3.0, v.gate_pre.type), compare_direction::GT),
                                  b.compare(v.gate_pre, b.constant(3.0, v.gate_pre.type), compare_direction::LT));
    const value dgate = b.select(inside, b.with_constant("divide", dforget, 6.0), b.constant(0.0, dforget.type));
    const value dz = b.transpose(b.concatenate({delta, dgate}, 0), {1, 0});  // [T, 2H]
    const value du = b.dot_general(dz, w, {}, {}, {1}, {1});               // dz W^T
    const value dw = b.dot_general(u, dz, {}, {}, {0}, {0});               // u^T dz
    const std::string key = "qrnn_block_backward." + strategy.name() + "." + std::to_string(steps) + "x" + std::to_string(features) + "x" +
                            std::to_string(hidden);
    return {key, b.finish("qrnn_block_backward", {du, dw}), {tu, tw, th}, {tu, tw}};
}

/// Emitted modules by key, so each op + shape is emitted (and, by the runtime, compiled) once.
/// Thread-safe; entries live as long as the cache.
class module_cache {
public:
    template <class Emit>
    const emitted_module& get(const std::string& key, Emit&& emit) {
        std::lock_guard<std::mutex> lock(mutex_);
        auto it = modules_.find(key);
        if (it == modules_.end()) it = modules_.emplace(key, emit()).first;
        return it->second;
    }
    std::size_t size() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return modules_.size();
    }

private:
    mutable std::mutex mutex_;
    std::map<std::string, emitted_module> modules_;
};

}  // namespace olmax::xla::stablehlo
