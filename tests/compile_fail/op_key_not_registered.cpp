// Must NOT compile: an op key of olmax (deriving from op::registered) that is not an entry of the
// registry op::all (ops/op_keys.hpp). The build must fail with the registry's static_assert text
// (checked by the CTest test xla_compile_op_key_not_registered).
#include <olmax/olmax.hpp>

namespace olmax::op {
struct cube : registered<cube> {
    static constexpr std::string_view name = "cube";
    struct attrs {};
};
}  // namespace olmax::op

int main() { return olmax::backend::trace::op_key<olmax::op::cube> ? 0 : 1; }
