// Must NOT compile: a complete primitive struct that is not an entry of the registry prim::all
// (xla/graph/ir.hpp). The build must fail with the registry's static_assert text (checked by the
// CTest test xla_compile_primitive_not_registered).
#include <olmax/xla/graph/graph.hpp>

namespace olmax::xla::graph::prim {
struct cube : detail::unary_elementwise<cube> {
    static constexpr std::string_view name = "cube";
    static double apply(double a) { return a * a * a; }
    static void gradient(vjp& v) { v.dx[0] = multiply::make(v.gy[0], multiply::make(v.x[0], v.x[0]) * 3.0); }
};
}  // namespace olmax::xla::graph::prim

int main() {
    namespace gx = olmax::xla::graph;
    gx::graph g;
    gx::prim::cube::make(g.input(gx::f32({2})));
    return 0;
}
