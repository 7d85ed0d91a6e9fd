#pragma once
// NumPy .npy files for tensors, through xtensor's reader/writer (xt::load_npy / xt::dump_npy),
// so arrays move between olmax and Python (numpy.load / numpy.save) unchanged.

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "olmax/core/core.hpp"
#include "olmax/detail/third_party.hpp"

namespace olmax::io {

/// Writes `tensor` as a C-order .npy file.
template <Scalar T>
void save_npy(const std::filesystem::path& path, const Tensor<T>& tensor) {
    std::ofstream out(path, std::ios::binary);
    check(out.good(), "save_npy: cannot create ", path.string());
    out << xt::dump_npy(tensor.xt());
    out.flush();
    check(out.good(), "save_npy: cannot write ", path.string());
}

/// Reads a .npy file whose dtype is exactly T (no silent conversion); C or Fortran order.
template <Scalar T>
Tensor<T> load_npy(const std::filesystem::path& path) {
    std::ifstream file(path, std::ios::binary);
    check(file.good(), "load_npy: cannot open ", path.string());
    std::istringstream in(std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>()));
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
        throw value_error(olmax::detail::concat("load_npy: ", path.string(), " cannot be read as ", dtype_name<T>(), ": ", e.what()));
    }
}

}  // namespace olmax::io
