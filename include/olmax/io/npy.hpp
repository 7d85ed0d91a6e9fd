#pragma once
// NumPy .npy files for tensors, through xtensor's reader/writer (xt::load_npy / xt::dump_npy),
// so arrays move between olmax and Python (numpy.load / numpy.save) unchanged.
//
// bfloat16: NumPy has no such dtype. `ml_dtypes` (jax's dtypes) saves its bfloat16 arrays with the
// descriptor '<V2' (2 raw bytes), NumPy loads them back as '|V2' and `.view(ml_dtypes.bfloat16)`
// restores the type. olmax writes '<V2' with the little-endian bit patterns and reads '<V2' or
// '|V2' (xtensor knows neither, so the header's descriptor is swapped for the equally long '<u2').

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/core/core.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::io {

namespace detail {

/// Replaces the first of `from` (same length as `to`) in the header of the .npy bytes (magic,
/// version, length, then the dictionary up to its '\n'); false when the header has none.
inline bool replace_npy_descr(std::string& bytes, std::initializer_list<std::string_view> from, std::string_view to) {
    const std::size_t header_end = bytes.find('\n');
    for (std::string_view f : from) {
        const std::size_t at = bytes.find(f);
        if (at != std::string::npos && at < header_end) {
            bytes.replace(at, f.size(), to);
            return true;
        }
    }
    return false;
}

/// Reads .npy `bytes` (of the file `path`; `as` names the dtype asked for, in messages) as a tensor
/// of element type T.
template <Scalar T>
Tensor<T> load_npy_bytes(const std::string& bytes, const std::filesystem::path& path, std::string_view as) {
    std::istringstream in(bytes);
    try {
        auto loaded = xt::load_npy<T>(in);
        check(!in.fail(), "load_npy: ", path.string(), " is truncated");
        Shape shape(loaded.shape().begin(), loaded.shape().end());
        auto out = Tensor<T>::uninitialized(shape);
        auto view = out.xt();
        view = loaded;  // xtensor assignment handles Fortran-ordered files
        return out;
    } catch (const olmax::error&) {
        throw;
    } catch (const std::exception& e) {
        throw value_error(olmax::detail::concat("load_npy: ", path.string(), " cannot be read as ", as, ": ", e.what()));
    }
}

}  // namespace detail

/// Writes `tensor` as a C-order .npy file (bfloat16 as ml_dtypes does: descriptor '<V2').
template <Scalar T>
void save_npy(const std::filesystem::path& path, const Tensor<T>& tensor) {
    std::ofstream out(path, std::ios::binary);
    check(out.good(), "save_npy: cannot create ", path.string());
    if constexpr (std::is_same_v<T, bfloat16>) {
        static_assert(std::endian::native == std::endian::little, "olmax: bfloat16 .npy files are written on little-endian hosts only");
        // The bit patterns as uint16 ('<u2'), then the descriptor renamed (bfloat16 is a standard-layout
        // wrapper of one uint16, pointer-interconvertible with it).
        auto bits = xt::adapt(reinterpret_cast<const std::uint16_t*>(tensor.data()), tensor.size(), xt::no_ownership(),
                              std::vector<std::size_t>(tensor.shape().begin(), tensor.shape().end()));
        std::string bytes = xt::dump_npy(bits);
        check(detail::replace_npy_descr(bytes, {"'<u2'"}, "'<V2'"), "save_npy: unexpected header from xtensor for ", path.string());
        out << bytes;
    } else {
        out << xt::dump_npy(tensor.xt());
    }
    out.flush();
    check(out.good(), "save_npy: cannot write ", path.string());
}

/// Reads a .npy file whose dtype is exactly T (no silent conversion); C or Fortran order. A
/// bfloat16 tensor reads files of descriptor '<V2' or '|V2' (ml_dtypes' bfloat16).
template <Scalar T>
Tensor<T> load_npy(const std::filesystem::path& path) {
    std::ifstream file(path, std::ios::binary);
    check(file.good(), "load_npy: cannot open ", path.string());
    std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if constexpr (std::is_same_v<T, bfloat16>) {
        check(detail::replace_npy_descr(bytes, {"'<V2'", "'|V2'"}, "'<u2'"), "load_npy: ", path.string(),
              " is not a bfloat16 array (expected the descriptor '<V2' that ml_dtypes writes)");
        const auto bits = detail::load_npy_bytes<std::uint16_t>(bytes, path, "bfloat16");
        auto out = Tensor<bfloat16>::uninitialized(bits.shape());
        std::transform(bits.begin(), bits.end(), out.begin(), [](std::uint16_t b) { return bfloat16::from_bits(b); });
        return out;
    } else {
        return detail::load_npy_bytes<T>(bytes, path, dtype_name<T>());
    }
}

}  // namespace olmax::io
