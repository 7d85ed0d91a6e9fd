#pragma once
// A layer's parameters in a file: the checkpoint format (archive.hpp: little-endian, versioned,
// CRC-32, atomic writes) holding only "param/<name>" entries, the names `nn::parameters` gives.
// A parameter file is therefore a training checkpoint without the step and optimiser state, and
// one reader (`Archive`) serves both.
//
//     olmax::io::save_parameters(model, "model.olmax");
//     olmax::io::load_parameters(model, "model.olmax");   // in place: the layer's handles stay valid

#include <algorithm>
#include <filesystem>
#include <istream>
#include <iterator>
#include <ostream>
#include <set>
#include <string>

#include "olmax/core/tensor.hpp"
#include "olmax/io/archive.hpp"
#include "olmax/nn/parameters.hpp"

namespace olmax::io {

/// Every parameter of `layer` under "param/<name>", in visiting order.
template <class L>
Archive parameters_archive(L& layer) {
    Archive a;
    a.put_text("olmax/kind", "parameters");
    a.put_text("olmax/param_dtype", std::string(dtype_name<typename L::value_type>()));
    for (const auto& p : nn::parameters(layer)) a.put("param/" + p.name, p.tensor);
    return a;
}

/// Copies the archive's parameters into `layer`'s (in place). Every parameter of the layer must be
/// stored with its shape and element type, and every stored parameter must exist in the layer;
/// otherwise `value_error` names the parameter.
template <class L>
void load_parameters(L& layer, const Archive& a) {
    using T = typename L::value_type;
    auto params = nn::parameters(layer);
    std::set<std::string> names;
    for (const auto& p : params) names.insert(p.name);
    for (const auto& key : a.names()) {
        if (key.rfind("param/", 0) != 0) continue;
        const std::string name = key.substr(6);
        check(names.count(name) != 0, "io::load_parameters: the file has parameter '", name, "' that layer ", L::name, " does not have");
    }
    for (const auto& p : params) {  // in visiting order, so the first problem named is the layer's first
        const std::string key = "param/" + p.name;
        check(a.contains(key), "io::load_parameters: the file has no parameter '", p.name, "' of layer ", L::name);
        check(a.entry(key).shape == p.tensor.shape(), "io::load_parameters: parameter '", p.name, "' has shape ",
              to_string(a.entry(key).shape), " in the file and ", to_string(p.tensor.shape()), " in the layer");
    }
    for (auto& p : params) {  // everything checked: now copy
        const Tensor<T> stored = a.get<T>("param/" + p.name);
        std::copy(stored.begin(), stored.end(), p.tensor.begin());
    }
}

template <class L>
void save_parameters(L& layer, std::ostream& out) {
    const std::string bytes = parameters_archive(layer).serialize();
    out.write(bytes.data(), std::streamsize(bytes.size()));
    check(static_cast<bool>(out), "io::save_parameters: write failed");
}
template <class L>
void load_parameters(L& layer, std::istream& in) {
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    load_parameters(layer, Archive::deserialize(bytes, "(stream)"));
}

/// Writes the file atomically (a crash leaves the old file or the new one).
template <class L>
void save_parameters(L& layer, const std::filesystem::path& path) { save_archive(path, parameters_archive(layer)); }
template <class L>
void load_parameters(L& layer, const std::filesystem::path& path) { load_parameters(layer, load_archive(path)); }

}  // namespace olmax::io
