#pragma once
// The padded operands of the bf16 GEMM edge-case tests, shared by the portable GEMM's
// (tests/unit/test_bfloat16.cpp) and oneDNN's (tests/onednn/test_onednn_gemm.cpp):
// A = [[1, 2, 3], [4, 5, 6]] inside rows of 5 and B = [[1, 0], [0, 1], [1, 1]] inside rows of 4,
// the padding 99 (a GEMM that reads it gives wrong numbers). A B = [[4, 5], [10, 11]].

#include <vector>

#include <olmax/core/bfloat16.hpp>

struct padded_bf16_operands {
    std::vector<olmax::bfloat16> a, b;  // lda 5, ldb 4
};

inline padded_bf16_operands make_padded_bf16_operands() {
    padded_bf16_operands p{std::vector<olmax::bfloat16>(2 * 5, olmax::bfloat16(99.0f)), std::vector<olmax::bfloat16>(3 * 4, olmax::bfloat16(99.0f))};
    const float av[2][3] = {{1, 2, 3}, {4, 5, 6}}, bv[3][2] = {{1, 0}, {0, 1}, {1, 1}};
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j) p.a[i * 5 + j] = olmax::bfloat16(av[i][j]);
    for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 2; ++j) p.b[i * 4 + j] = olmax::bfloat16(bv[i][j]);
    return p;
}
