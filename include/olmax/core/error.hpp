#pragma once
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

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
}

}  // namespace detail

/// Throws `Error` with the concatenated message when `condition` is false.
template <class Error = value_error, class... Parts>
void check(bool condition, const Parts&... parts) {
    if (!condition) throw Error(detail::concat(parts...));
}

}  // namespace olmax
