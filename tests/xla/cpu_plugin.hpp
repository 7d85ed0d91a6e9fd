#pragma once
// The real OpenXLA CPU plugin for the [cpu_plugin] tests: CTest passes its path in
// OLMAX_TEST_CPU_PJRT_PLUGIN (tests/xla/CMakeLists.txt).

#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>

#include <olmax/xla/pjrt_runtime.hpp>

namespace olmax_test {

/// A client on the CPU plugin; FAILs the test when the variable is not set.
inline std::shared_ptr<olmax::xla::pjrt::client> cpu_client() {
    const char* path = std::getenv("OLMAX_TEST_CPU_PJRT_PLUGIN");
    if (!path || !*path) FAIL("OLMAX_TEST_CPU_PJRT_PLUGIN is not set (run this test through CTest)");
    return std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(path));
}

}  // namespace olmax_test
