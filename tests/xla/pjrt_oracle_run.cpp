// Runs the cases written by xla_oracle_dump through a PJRT plugin with olmax's own runtime and
// compares with the CPU reference outputs: the end-to-end check for a TPU VM or an NVIDIA GPU.
//
// Usage: olmax_pjrt_oracle <oracle folder> [--plugin <path>] [--only <prefix>[,<prefix>...]] [--no-preallocate]
//   plugin defaults to $OLMAX_PJRT_PLUGIN; --no-preallocate passes {"preallocate", false} (CUDA plugin).
// Exit status 0 when every case behaved (match / mismatch detected / compile error reported).

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "olmax/xla/pjrt_runtime.hpp"

namespace pjrt = olmax::xla::pjrt;
namespace shlo = olmax::xla::stablehlo;

namespace {

struct entry {
    std::string file;
    shlo::dims_t dims;
};
struct oracle_case {
    std::string name, expect;
    std::vector<entry> inputs, outputs;
};

std::vector<oracle_case> read_manifest(const std::filesystem::path& folder) {
    std::ifstream in(folder / "manifest.txt");
    if (!in) throw std::runtime_error("cannot read " + (folder / "manifest.txt").string());
    std::vector<oracle_case> cases;
    std::string kind, a, b;
    while (in >> kind >> a >> b) {
        if (kind == "case") {
            cases.push_back({a, b, {}, {}});
            continue;
        }
        entry e{a, {}};
        if (b != "-") {
            std::stringstream dims(b);
            for (std::string d; std::getline(dims, d, ',');) e.dims.push_back(std::stoll(d));
        }
        (kind == "in" ? cases.back().inputs : cases.back().outputs).push_back(e);
    }
    return cases;
}

std::vector<float> read_floats(const std::filesystem::path& path, std::size_t count) {
    std::vector<float> v(count);
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!in) throw std::runtime_error("cannot read " + path.string());
    return v;
}

std::size_t count(const shlo::dims_t& dims) {
    std::size_t n = 1;
    for (auto d : dims) n *= static_cast<std::size_t>(d);
    return n;
}

std::string slurp(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::cerr << "usage: olmax_pjrt_oracle <oracle folder> [--plugin <path>] [--only <prefix>,...] [--no-preallocate]\n";
        return 2;
    }
    const std::filesystem::path folder = argv[1];
    std::string plugin_path;
    std::vector<std::string> only;
    std::vector<pjrt::create_option> options;
    for (int i = 2; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--plugin" && i + 1 < argc) plugin_path = argv[++i];
        else if (arg == "--only" && i + 1 < argc) {
            std::stringstream list(argv[++i]);
            for (std::string p; std::getline(list, p, ',');) only.push_back(p);
        } else if (arg == "--no-preallocate") options.push_back({"preallocate", false});
        else {
            std::cerr << "olmax_pjrt_oracle: unknown argument " << arg << "\n";
            return 2;
        }
    }
    try {
        const pjrt::plugin& plugin = pjrt::plugin::load(plugin_path);
        pjrt::client client(plugin, options);
        std::printf("plugin %s (PJRT API %s), platform %s\n", plugin.path().c_str(), plugin.version_string().c_str(),
                    client.platform_name().c_str());
        for (const auto& [name, value] : plugin.attributes()) std::printf("  %s = %s\n", name.c_str(), value.c_str());
        int failures = 0, ran = 0;
        for (const auto& c : read_manifest(folder)) {
            bool selected = only.empty();
            for (const auto& p : only) selected |= c.name.rfind(p, 0) == 0;
            if (!selected) continue;
            ++ran;
            const auto start = std::chrono::steady_clock::now();
            const pjrt::executable* exe = nullptr;
            try {
                exe = &client.compile(c.name, slurp(folder / (c.name + ".mlir")));
            } catch (const pjrt::pjrt_error& e) {
                if (c.expect == "compile_error") std::printf("ok    %s: rejected as expected: %s\n", c.name.c_str(), e.what());
                else {
                    ++failures;
                    std::printf("FAIL  %s: %s\n", c.name.c_str(), e.what());
                }
                continue;
            }
            if (c.expect == "compile_error") {
                ++failures;
                std::printf("FAIL  %s: malformed module was accepted\n", c.name.c_str());
                continue;
            }
            try {
                std::vector<pjrt::device_buffer> buffers;
                for (const auto& in : c.inputs) {
                    const auto host = read_floats(folder / in.file, count(in.dims));
                    buffers.push_back(client.upload(host.data(), in.dims));
                }
                std::vector<const pjrt::device_buffer*> args;
                for (const auto& b : buffers) args.push_back(&b);
                auto outputs = client.execute(*exe, args);
                double worst = 0;
                std::string problem;
                if (outputs.size() != c.outputs.size()) problem = "wrong number of outputs";
                for (std::size_t i = 0; problem.empty() && i < outputs.size(); ++i) {
                    const std::size_t n = count(c.outputs[i].dims);
                    const auto expected = read_floats(folder / c.outputs[i].file, n);
                    std::vector<float> got(n);
                    client.download(outputs[i], got.data(), n);
                    double max_ref = 0;
                    for (float v : expected) max_ref = std::max(max_ref, std::abs(double(v)));
                    for (std::size_t j = 0; j < n; ++j) {
                        const double scale = std::abs(double(expected[j])) + max_ref, error = std::abs(double(got[j]) - double(expected[j]));
                        const double ratio = scale > 0 ? error / scale : error;
                        worst = std::max(worst, ratio);
                        if (!std::isfinite(got[j]) || !(error <= 1e-5 * scale)) problem = "output " + std::to_string(i) + " differs";
                    }
                }
                const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
                if (c.expect == "mismatch") {
                    if (problem.empty()) ++failures;
                    std::printf("%s  %s: wrong module %s\n", problem.empty() ? "FAIL" : "ok  ", c.name.c_str(),
                                problem.empty() ? "NOT detected" : "detected");
                } else if (!problem.empty()) {
                    ++failures;
                    std::printf("FAIL  %s: %s (max |err|/scale %.3e)\n", c.name.c_str(), problem.c_str(), worst);
                } else {
                    std::printf("ok    %s: max |err|/scale %.2e (%.0f ms compile+run)\n", c.name.c_str(), worst, ms);
                }
            } catch (const olmax::error& e) {
                ++failures;
                std::printf("FAIL  %s: %s\n", c.name.c_str(), e.what());
            }
        }
        std::printf("%d case(s) run, %d failed\n", ran, failures);
        return failures || ran == 0 ? 1 : 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "olmax_pjrt_oracle: %s\n", e.what());
        return 1;
    }
}
