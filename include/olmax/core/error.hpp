#pragma once
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace olmax {

/// Base class of every exception olmax throws on its own account.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Shapes of the operands do not fit the operation (the message names the op and the shapes).
class shape_error : public error {
public:
    using error::error;
};

/// An argument is outside what the operation accepts (negative size, empty vocabulary, ...).
class value_error : public error {
public:
    using error::error;
};

/// The autodiff tape was used in a way that cannot give correct gradients.
class autodiff_error : public error {
public:
    using error::error;
};

/// A tensor buffer could not be allocated (the message names the shape and the bytes asked for).
class allocation_error : public error {
public:
    using error::error;
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

/// "1.5 GiB", "512 B": a byte count for messages.
inline std::string human_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB"};
    std::size_t unit = 0;
    while (bytes >= 1024 && unit + 1 < std::size(units)) bytes /= 1024, ++unit;
    std::ostringstream out;
    out.precision(unit == 0 ? 0 : 3);
    out << (unit == 0 ? std::fixed : std::defaultfloat) << bytes << ' ' << units[unit];
    return out.str();
}

}  // namespace detail

/// Throws `Error` with the concatenated message when `condition` is false.
template <class Error = value_error, class... Parts>
void check(bool condition, const Parts&... parts) {
    if (!condition) throw Error(detail::concat(parts...));
}

}  // namespace olmax
