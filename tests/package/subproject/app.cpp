// The smallest program that uses olmax through the subproject's olmax::olmax target.
#include <olmax/core/core.hpp>

int main() {
    const auto t = olmax::full<float>({2, 3}, 1.5f);
    return t.size() == 6 && t(1, 2) == 1.5f ? 0 : 1;
}
