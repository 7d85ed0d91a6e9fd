#pragma once
// Parameter listing, gradient reset and serialisation for every conforming layer, all through
// `visit_parameters` (so they work the same for a Linear, a Reversible block or a whole Stack).

#include <cstdint>
#include <cstring>
#include <istream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "olmax/nn/contract.hpp"

namespace olmax::nn {

/// One trainable tensor with its deterministic hierarchical name and its role.
template <Real T>
struct NamedParameter {
    std::string name;    ///< e.g. "stack/dense/conv0/weight" (stacked) or "linear/weight"
    Tensor<T> tensor;    ///< the trainable leaf (a stacked one has a leading depth axis)
    Role role;
    Sharing sharing;
    bool stacked = false;  ///< has a leading [depth] axis (inside nn::Stack, not tied)
};

/// Every parameter of `layer`, in visiting order, names prefixed by `L::name`.
template <class L>
std::vector<NamedParameter<typename L::value_type>> parameters(L& layer) {
    static_assert(detail::declares_value_type<L> && detail::declares_name<L> && detail::has_parameters<L>,
                  "olmax::nn::parameters: the type must declare value_type and name and have visit_parameters(ParameterVisitor<value_type>&)");
    using T = typename L::value_type;
    std::vector<NamedParameter<T>> out;
    ParameterVisitor<T> visit([&](const std::string& name, Tensor<T>& t, Role role, Sharing sharing) {
        out.push_back({name, t, role, sharing, false});
    });
    visit.child(L::name, layer);
    return out;
}

/// Parameters of one role (e.g. `Role::weight` for weight decay).
template <class L>
std::vector<NamedParameter<typename L::value_type>> parameters_with_role(L& layer, Role role) {
    auto all = parameters(layer);
    std::erase_if(all, [role](const auto& p) { return p.role != role; });
    return all;
}

/// Total number of scalar parameters.
template <class L>
std::size_t parameter_count(L& layer) {
    std::size_t n = 0;
    for (const auto& p : parameters(layer)) n += p.tensor.size();
    return n;
}

/// Drops the accumulated gradient of every parameter.
template <class L>
void zero_grad(L& layer) {
    for (auto& p : parameters(layer)) p.tensor.zero_grad();
}

namespace detail {
inline constexpr char parameter_file_magic[8] = {'O', 'L', 'M', 'X', 'P', 'A', 'R', 'M'};
inline constexpr std::uint32_t parameter_file_version = 1;

template <class V>
void write_pod(std::ostream& out, const V& v) { out.write(reinterpret_cast<const char*>(&v), sizeof(V)); }
template <class V>
V read_pod(std::istream& in, std::string_view what) {
    V v{};
    in.read(reinterpret_cast<char*>(&v), sizeof(V));
    check<value_error>(static_cast<bool>(in), "nn::load_parameters: stream ended while reading ", what);
    return v;
}
}  // namespace detail

/// Writes every parameter (name, role, element size, shape, data) with a magic tag and a format
/// version, in visiting order. Host byte order.
template <class L>
void save_parameters(L& layer, std::ostream& out) {
    using T = typename L::value_type;
    const auto params = parameters(layer);
    out.write(detail::parameter_file_magic, sizeof detail::parameter_file_magic);
    detail::write_pod(out, detail::parameter_file_version);
    detail::write_pod(out, std::uint64_t(params.size()));
    for (const auto& p : params) {
        detail::write_pod(out, std::uint64_t(p.name.size()));
        out.write(p.name.data(), std::streamsize(p.name.size()));
        detail::write_pod(out, std::uint8_t(p.role));
        detail::write_pod(out, std::uint8_t(sizeof(T)));
        detail::write_pod(out, std::uint64_t(p.tensor.rank()));
        for (std::size_t d : p.tensor.shape()) detail::write_pod(out, std::uint64_t(d));
        out.write(reinterpret_cast<const char*>(p.tensor.data()), std::streamsize(p.tensor.size() * sizeof(T)));
    }
    check<value_error>(static_cast<bool>(out), "nn::save_parameters: write failed");
}

/// Reads a file written by `save_parameters` into `layer`'s parameters (in place, keeping the
/// handles). Every stored name must exist with the same shape and element size, and every parameter
/// must be stored; otherwise `value_error` names the parameter.
template <class L>
void load_parameters(L& layer, std::istream& in) {
    using T = typename L::value_type;
    char magic[sizeof detail::parameter_file_magic];
    in.read(magic, sizeof magic);
    check<value_error>(in && std::memcmp(magic, detail::parameter_file_magic, sizeof magic) == 0,
                       "nn::load_parameters: not an olmax parameter file");
    const auto version = detail::read_pod<std::uint32_t>(in, "the version");
    check<value_error>(version >= 1 && version <= detail::parameter_file_version, "nn::load_parameters: unsupported format version ", version);
    auto params = parameters(layer);
    std::map<std::string, NamedParameter<T>*> by_name;
    for (auto& p : params) by_name[p.name] = &p;
    const auto count = detail::read_pod<std::uint64_t>(in, "the parameter count");
    check<value_error>(count == params.size(), "nn::load_parameters: file has ", count, " parameters, layer ", L::name, " has ",
                       params.size());
    for (std::uint64_t i = 0; i < count; ++i) {
        std::string name(detail::read_pod<std::uint64_t>(in, "a name length"), '\0');
        in.read(name.data(), std::streamsize(name.size()));
        const auto it = by_name.find(name);
        check<value_error>(it != by_name.end(), "nn::load_parameters: the file has parameter '", name, "' that layer ", L::name,
                           " does not have");
        Tensor<T>& t = it->second->tensor;
        detail::read_pod<std::uint8_t>(in, "a role");
        const auto element = detail::read_pod<std::uint8_t>(in, "an element size");
        check<value_error>(element == sizeof(T), "nn::load_parameters: parameter '", name, "' has ", int(element),
                           "-byte elements in the file, the layer uses ", sizeof(T));
        Shape shape(detail::read_pod<std::uint64_t>(in, "a rank"));
        for (auto& d : shape) d = detail::read_pod<std::uint64_t>(in, "a shape");
        check<value_error>(shape == t.shape(), "nn::load_parameters: parameter '", name, "' has shape ", to_string(shape),
                           " in the file and ", to_string(t.shape()), " in the layer");
        in.read(reinterpret_cast<char*>(t.data()), std::streamsize(t.size() * sizeof(T)));
        check<value_error>(static_cast<bool>(in), "nn::load_parameters: stream ended inside parameter '", name, "'");
        by_name.erase(it);
    }
}

/// The thin user-facing wrapper around a layer's details: owns the layer, calls it, lists and
/// serialises its parameters.
///
///     olmax::nn::Module<olmax::nn::Linear<double>> linear(config);
///     auto y = linear(x);
template <class L>
class Module {
    static_assert(assert_layer<L>());

public:
    using value_type = typename L::value_type;
    using layer_type = L;

    explicit Module(const typename L::config_type& config) : Module(config, seeded(config)) {}
    Module(const typename L::config_type& config, Generator&& rng) : layer_(config, rng) {}
    Module(const typename L::config_type& config, Generator& rng) : layer_(config, rng) {}

    Tensor<value_type> operator()(const Tensor<value_type>& x, const LayerContext& ctx = {}) const { return layer_.forward(x, ctx); }
    auto parameters() { return nn::parameters(layer_); }
    void zero_grad() { nn::zero_grad(layer_); }
    void save(std::ostream& out) { save_parameters(layer_, out); }
    void load(std::istream& in) { load_parameters(layer_, in); }
    L& layer() { return layer_; }
    const L& layer() const { return layer_; }

private:
    static Generator seeded(const typename L::config_type& config) {
        if constexpr (requires { config.seed; }) return Generator(config.seed);
        else return Generator(0);
    }
    L layer_;
};

}  // namespace olmax::nn
