// Must NOT compile: a registered-looking primitive struct without `evaluate` (its reference
// evaluation) used to build a node. The build must fail with the registry's static_assert text
// (checked by the CTest test xla_compile_primitive_missing_evaluate).
#include <olmax/xla/graph/graph.hpp>

namespace olmax::xla::graph::prim {
struct no_evaluate {
    static constexpr std::string_view name = "no_evaluate";
    static constexpr no_gradient gradient{};
    static value emit(function_builder&, const node&, const std::vector<value>& in) { return in[0]; }
};
}  // namespace olmax::xla::graph::prim

int main() {
    namespace gx = olmax::xla::graph;
    gx::graph g;
    const gx::var x = g.input(gx::f32({2}));
    gx::detail::make<gx::prim::no_evaluate>({x}, x.type());
    return 0;
}
