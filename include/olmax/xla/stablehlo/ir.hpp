#pragma once
// The StableHLO IR as the emitter sees it: element types, static tensor types, SSA values and
// comparison directions. Printing follows the MLIR type syntax (`tensor<4x128xf32>`).

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace olmax::xla::stablehlo {

/// bf16: only as the operands of a dot_general with an f32 result (the bf16 precision policy, docs/BF16.md).
enum class element { f32, i32, i1, bf16 };

inline std::string_view element_name(element e) {
    switch (e) {
        case element::f32: return "f32";
        case element::i32: return "i32";
        case element::i1: return "i1";
        case element::bf16: return "bf16";
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

}  // namespace olmax::xla::stablehlo
