#pragma once
#include <charconv>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>

#include "olmax/core/error.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax {

/// Extents of a row-major tensor, outermost first. A small vector (xtensor's `svector`): shapes of
/// up to six dimensions never touch the heap.
using Shape = xt::svector<std::size_t, 6>;

inline std::string to_string(const Shape& shape) {
    // std::to_chars, not an ostringstream: many ops' argument checks form this string on every
    // call, and an ostringstream's construction (its locale) cost more than a small op's work.
    std::string out(1, '[');
    char digits[std::numeric_limits<std::size_t>::digits10 + 2];
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) out += ", ";
        out.append(digits, std::to_chars(digits, digits + sizeof(digits), shape[i]).ptr);
    }
    out += ']';
    return out;
}

/// Number of elements of a tensor of this shape (1 for a scalar of rank 0, 0 if any extent is 0).
/// Throws `shape_error` when the count does not fit in `std::size_t`: a wrapped product would give
/// a tiny buffer for a huge shape, and element access would then write out of bounds. An extent
/// above 2^63 is refused on its own, even beside a 0: it is a negative size (`zeros({n, 3})` with
/// n = -1) converted to the unsigned `std::size_t`, and the message says so.
inline std::size_t numel(const Shape& shape) {
    for (std::size_t axis = 0; axis < shape.size(); ++axis)
        if (shape[axis] > std::size_t(std::numeric_limits<std::ptrdiff_t>::max()))
            throw shape_error("shape " + to_string(shape) + ": extent " + std::to_string(axis) + " is " +
                              std::to_string(static_cast<std::ptrdiff_t>(shape[axis])) +
                              " converted to an unsigned size; sizes must be >= 0 (check the value given for axis " +
                              std::to_string(axis) + ")");
    std::size_t n = 1;
    bool overflow = false;
    for (std::size_t extent : shape) {
        if (extent == 0) return 0;  // an empty tensor, whatever the other extents
        overflow |= __builtin_mul_overflow(n, extent, &n);
    }
    if (overflow) throw shape_error("shape " + to_string(shape) + " has more elements than fit in 64 bits");
    return n;
}

/// Row-major strides, in elements.
inline Shape row_major_strides(const Shape& shape) {
    Shape strides(shape.size(), 1);
    for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
    return strides;
}

/// Resolves a possibly negative axis (-1 = last) against a rank; throws on out-of-range axes.
inline std::size_t normalize_axis(long axis, std::size_t rank, std::string_view op) {
    const long r = static_cast<long>(rank);
    if (axis < -r || axis >= r)
        throw shape_error(detail::concat(op, ": axis ", axis, " is out of range for a tensor of rank ", rank));
    return static_cast<std::size_t>(axis < 0 ? axis + r : axis);
}

/// NumPy broadcasting of two shapes; throws `shape_error` naming `op` and both shapes.
inline Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
    const std::size_t rank = std::max(a.size(), b.size());
    Shape out(rank, 1);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::size_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
        const std::size_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
        if (da != db && da != 1 && db != 1)
            throw shape_error(detail::concat(op, ": shapes ", to_string(a), " and ", to_string(b),
                                             " cannot be broadcast together"));
        out[i] = da == 1 ? db : da;
    }
    return out;
}

namespace detail {

/// Extents before, at and after one axis: a row-major tensor is laid out as [outer, n, inner]
/// around it, which is how every per-axis loop (reductions, slices, concatenation) walks it.
struct AxisSplit {
    std::size_t outer = 1, n = 1, inner = 1;
};
inline AxisSplit split_at(const Shape& s, std::size_t axis) {
    AxisSplit r;
    for (std::size_t i = 0; i < axis; ++i) r.outer *= s[i];
    r.n = s[axis];
    for (std::size_t i = axis + 1; i < s.size(); ++i) r.inner *= s[i];
    return r;
}

}  // namespace detail

}  // namespace olmax
