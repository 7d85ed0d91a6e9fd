// PJRT runtime tests that need no device: plugin loading errors, version check, compile errors,
// and the whole upload/execute/read-back path against a mock plugin built from test sources.
// Paths come from the environment (set by tests/xla/CMakeLists.txt):
//   OLMAX_TEST_MOCK_PJRT_PLUGIN  the mock plugin .so;  OLMAX_TEST_NO_SYMBOL_LIB  a .so without GetPjrtApi.

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "olmax/backend/cpu_serial.hpp"
#include "olmax/xla/device_program.hpp"
#include "olmax/xla/pjrt_runtime.hpp"
#include "test_helpers.hpp"

namespace pjrt = olmax::xla::pjrt;
namespace shlo = olmax::xla::stablehlo;
namespace gx = olmax::xla::graph;
using Catch::Matchers::Contains;

namespace {

/// The module of `x op y` (op "add" or "multiply") on two inputs of `dims`, emitted the way every
/// program is (the graph's lowering); named `binary`, which the mock plugin interprets.
shlo::emitted_module pjrt_test_binary_module(std::string_view op, const shlo::dims_t& dims) {
    gx::graph g;
    const gx::var x = g.input(gx::f32(dims)), y = g.input(gx::f32(dims));
    return gx::emit(g, "binary", {op == "add" ? x + y : x * y});
}

std::string env_path(const char* name) {
    const char* v = std::getenv(name);
    if (!v || !*v) FAIL(std::string(name) + " is not set (run this test through CTest)");
    return v;
}

std::string mock_path() { return env_path("OLMAX_TEST_MOCK_PJRT_PLUGIN"); }

template <class Fn>
Fn* mock_hook(const char* name) {
    void* handle = dlopen(mock_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    REQUIRE(handle != nullptr);
    void* symbol = dlsym(handle, name);
    REQUIRE(symbol != nullptr);
    return reinterpret_cast<Fn*>(symbol);
}

int live_objects() { return mock_hook<int()>("olmax_mock_pjrt_live_objects")(); }
int order_violations() { return mock_hook<int()>("olmax_mock_pjrt_order_violations")(); }

/// Expects `f` to throw a pjrt_error whose message contains `text`; returns its code.
template <class F>
int expect_pjrt_error(F&& f, const std::string& text) {
    try {
        f();
    } catch (const pjrt::pjrt_error& e) {
        INFO(e.what());
        CHECK_THAT(e.what(), Contains(text));
        return e.code();
    }
    FAIL("no pjrt_error thrown (expected one mentioning '" + text + "')");
    return -1;
}

/// The mock plugin loaded from a private copy of its file with `variable` = `value` while it
/// initialises (the mock reads its settings in GetPjrtApi, once per loaded file); the copy is
/// removed at the end.
class configured_mock {
public:
    configured_mock(const std::string& tag, const char* variable, const char* value)
        : copy_(std::filesystem::temp_directory_path() / ("olmax_mock_pjrt_" + tag + "_" + std::to_string(::getpid()) + ".so")) {
        std::filesystem::copy_file(mock_path(), copy_, std::filesystem::copy_options::overwrite_existing);
        setenv(variable, value, 1);
        plugin_ = &pjrt::plugin::load(copy_.string());
        unsetenv(variable);
    }
    ~configured_mock() { std::filesystem::remove(copy_); }
    configured_mock(const configured_mock&) = delete;
    configured_mock& operator=(const configured_mock&) = delete;

    const pjrt::plugin& plugin() const { return *plugin_; }
    /// PJRT objects the plugin still holds (0 once every client, buffer, event and error is gone).
    int live_objects() const {
        void* handle = dlopen(copy_.c_str(), RTLD_NOW | RTLD_NOLOAD);
        REQUIRE(handle != nullptr);
        return reinterpret_cast<int (*)()>(dlsym(handle, "olmax_mock_pjrt_live_objects"))();
    }

private:
    std::filesystem::path copy_;
    const pjrt::plugin* plugin_ = nullptr;
};

}  // namespace

TEST_CASE("pjrt: a missing plugin file is a clear error naming the path", "[xla][pjrt]") {
    const int code = expect_pjrt_error([] { pjrt::plugin::load("/nonexistent/olmax/libno_such_plugin.so"); }, "/nonexistent/olmax/libno_such_plugin.so");
    CHECK(code == PJRT_Error_Code_NOT_FOUND);
}

TEST_CASE("pjrt: no path and no OLMAX_PJRT_PLUGIN names the environment variable", "[xla][pjrt]") {
    const char* saved = std::getenv("OLMAX_PJRT_PLUGIN");
    const std::string keep = saved ? saved : "";
    unsetenv("OLMAX_PJRT_PLUGIN");
    expect_pjrt_error([] { pjrt::plugin::load(); }, "OLMAX_PJRT_PLUGIN");
    if (saved) setenv("OLMAX_PJRT_PLUGIN", keep.c_str(), 1);
}

TEST_CASE("pjrt: a shared object without GetPjrtApi is rejected", "[xla][pjrt]") {
    const int code = expect_pjrt_error([] { pjrt::plugin::load(env_path("OLMAX_TEST_NO_SYMBOL_LIB")); }, "no GetPjrtApi symbol");
    CHECK(code == PJRT_Error_Code_NOT_FOUND);
}

TEST_CASE("pjrt: an API major version mismatch is rejected before initialisation", "[xla][pjrt]") {
    // A private copy of the mock (its own dlopen handle and statics) reporting major version 1.
    const auto copy = std::filesystem::temp_directory_path() / ("olmax_mock_pjrt_major1_" + std::to_string(::getpid()) + ".so");
    std::filesystem::copy_file(mock_path(), copy, std::filesystem::copy_options::overwrite_existing);
    setenv("OLMAX_MOCK_PJRT_MAJOR", "1", 1);
    const int code = expect_pjrt_error([&] { pjrt::plugin::load(copy.string()); }, "major version mismatch");
    unsetenv("OLMAX_MOCK_PJRT_MAJOR");
    std::filesystem::remove(copy);
    CHECK(code == PJRT_Error_Code_FAILED_PRECONDITION);
}

TEST_CASE("pjrt: the mock plugin runs emitted modules end to end, once initialised, without leaks", "[xla][pjrt]") {
    setenv("OLMAX_PJRT_PLUGIN", mock_path().c_str(), 1);
    const pjrt::plugin& plugin = pjrt::plugin::load();  // through the environment variable
    CHECK(&plugin == &pjrt::plugin::load(mock_path()));   // one plugin per path: Initialize ran once
    CHECK(mock_hook<int()>("olmax_mock_pjrt_initialize_calls")() == 1);
    CHECK(plugin.major_version() == PJRT_API_MAJOR);
    const auto attributes = plugin.attributes();
    CHECK(attributes.at("stablehlo_current_version") == "1.9.3");
    CHECK(attributes.at("xla_version") == "2");
    {
        auto client = std::make_shared<pjrt::client>(plugin);
        CHECK(client->platform_name() == "mock");
        const auto module = pjrt_test_binary_module("add", {2, 3});
        const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{10, 20, 30, 40, 50, 60};
        const auto out = client->run(module, {a.data(), b.data()});
        REQUIRE(out.size() == 1);
        CHECK(out[0] == std::vector<float>{11, 22, 33, 44, 55, 66});
        client->run(module, {a.data(), b.data()});
        CHECK(client->cached_executables() == 1);  // cached by the module's key

        std::size_t size = 0;
        const char* bytes = mock_hook<const char*(std::size_t*)>("olmax_mock_pjrt_last_compile_options")(&size);
        CHECK(std::string(bytes, size) ==
              std::string(reinterpret_cast<const char*>(olmax::xla::compile_options_bytes), sizeof olmax::xla::compile_options_bytes));

        // Wrong input count is a shape_error before any device call.
        CHECK_THROWS_AS(client->run(module, {a.data()}), olmax::shape_error);

        // A buffer that outlives the client handle still dies before the client itself.
        pjrt::device_buffer survivor = client->upload(a.data(), {2, 3});
        client.reset();
        CHECK(order_violations() == 0);
    }
    CHECK(order_violations() == 0);
    CHECK(live_objects() == 0);
}

TEST_CASE("pjrt: a compile error carries the plugin's message and code", "[xla][pjrt]") {
    pjrt::client client(pjrt::plugin::load(mock_path()));
    const int code = expect_pjrt_error([&] { client.compile("broken", "module @m { this is not StableHLO }"); }, "no 'func.func public @main'");
    CHECK(code == PJRT_Error_Code_INVALID_ARGUMENT);
    CHECK(client.cached_executables() == 0);
    expect_pjrt_error([&] { client.compile("broken", "module @m { this is not StableHLO }"); }, "PJRT_Client_Compile of broken");
}

TEST_CASE("pjrt: an asynchronous execution error surfaces when the event is awaited, nothing leaks", "[xla][pjrt]") {
    configured_mock failing("failing", "OLMAX_MOCK_PJRT_FAIL_EXECUTE", "1");
    {
        pjrt::client client(failing.plugin());
        const auto module = pjrt_test_binary_module("multiply", {4});
        const std::vector<float> a{1, 2, 3, 4};
        const int code = expect_pjrt_error([&] { client.run(module, {a.data(), a.data()}); }, "injected device failure");
        CHECK(code == PJRT_Error_Code_INTERNAL);
    }
    CHECK(failing.live_objects() == 0);
}

TEST_CASE("pjrt: a device out of memory is a clear error naming what ran out, nothing leaks", "[xla][pjrt]") {
    // The mock's device holds 24 bytes: the state (4 floats) fits, the step's input does not.
    configured_mock small("small", "OLMAX_MOCK_PJRT_DEVICE_BYTES", "24");
    {
        auto client = std::make_shared<pjrt::client>(small.plugin());
        olmax::xla::device_program program(client, pjrt_test_binary_module("add", {4}), 1);  // state += input
        program.set_state(0, {1, 2, 3, 4});
        const std::vector<float> step{1, 1, 1, 1};
        const int code = expect_pjrt_error([&] { program.run({step.data()}); }, "the device ran out of memory while running a step");
        CHECK(code == PJRT_Error_Code_RESOURCE_EXHAUSTED);
        expect_pjrt_error([&] { program.run({step.data()}); }, "mock: out of device memory allocating 16 bytes");
        CHECK_THROWS_WITH(program.set_state(0, {1, 2, 3, 4, 5, 6, 7, 8}), Contains("got 8 values"));
    }
    CHECK(small.live_objects() == 0);
}

// ---- the real OpenXLA CPU plugin (the xla-cpu-pjrt wheel): OLMAX_TEST_CPU_PJRT_PLUGIN ----------------

TEST_CASE("pjrt: the OpenXLA CPU plugin runs emitted modules: an addition, and a matmul equal to cpu_serial's", "[xla][pjrt][cpu_plugin]") {
    const std::string path = env_path("OLMAX_TEST_CPU_PJRT_PLUGIN");
    const pjrt::plugin& plugin = pjrt::plugin::load(path);
    CHECK(plugin.major_version() == PJRT_API_MAJOR);
    auto client = std::make_shared<pjrt::client>(plugin);
    CHECK(client->platform_name() == "cpu");

    const auto add = pjrt_test_binary_module("add", {2, 3});
    const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{10, 20, 30, 40, 50, 60};
    const auto sum = client->run(add, {a.data(), b.data()});
    REQUIRE(sum.size() == 1);
    CHECK(sum[0] == std::vector<float>{11, 22, 33, 44, 55, 66});

    // A product on the device against the reference GEMM (HIGHEST precision: f32 on the CPU too).
    gx::graph g;
    const gx::var x = g.input(gx::f32({33, 70})), w = g.input(gx::f32({70, 17}));
    const auto product = gx::emit(g, "matmul", {gx::matmul(x, w)});
    olmax::Generator rng(5);
    const auto xs = olmax::randn<float>({33, 70}, rng), ws = olmax::randn<float>({70, 17}, rng);
    const auto on_device = client->run(product, {xs.data(), ws.data()});
    std::vector<float> reference(33 * 17);
    olmax::backend::cpu_serial::gemm(false, false, 33, 17, 70, 1.0f, xs.data(), 70, ws.data(), 17, 0.0f, reference.data(), 17);
    REQUIRE(on_device[0].size() == reference.size());
    double worst = 0;
    for (std::size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, double(std::abs(on_device[0][i] - reference[i])));
    CHECK(worst < 1e-4);
}
