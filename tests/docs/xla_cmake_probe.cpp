// docs/xla.md's CMake block ("Your own model on XLA") is checked with this program in the place of
// my_model.cpp (tests/docs/check_xla_own_model.py): the example itself is built and run from the
// block's compile line just before, so here the block only has to give a program what olmax::pjrt
// gives (olmax's headers, the PJRT header, -fpermissive, -ldl) and the program has to run on the
// plugin. It loads the plugin named by argv[1] and adds two vectors on it.
#include <cstdio>
#include <memory>
#include <vector>

#include <olmax/xla/device_program.hpp>
#include <olmax/xla/pjrt_runtime.hpp>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s <PJRT plugin .so>\n", argv[0]);
        return 2;
    }
    namespace gx = olmax::xla::graph;
    auto client = std::make_shared<olmax::xla::pjrt::client>(olmax::xla::pjrt::plugin::load(argv[1]));
    gx::graph g;
    const gx::var x = g.input(gx::f32({3})), y = g.input(gx::f32({3}));
    const auto module = gx::emit(g, "binary", {x + y});
    const std::vector<float> a{1, 2, 3}, b{10, 20, 30};
    const auto sum = client->run(module, {a.data(), b.data()});
    const bool right = sum.size() == 1 && sum[0] == std::vector<float>{11, 22, 33};
    std::printf("olmax::pjrt program on %s: 1 + 10, 2 + 20, 3 + 30 %s\n", client->platform_name().c_str(), right ? "right" : "WRONG");
    return right ? 0 : 1;
}
