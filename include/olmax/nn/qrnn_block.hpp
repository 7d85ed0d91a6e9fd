#pragma once
// QRNNBlock<Strategy>: the scan engine's QRNN layer (nn/qrnn.hpp) as a residual-stream function for
// nn::Reversible / nn::Stack: F -> F, sandwiched between two ScaleNorms like the original's other
// blocks. Strategy picks the scan algorithm (olmax::scan strategy tags); all give the same values.

#include "olmax/nn/norm.hpp"
#include "olmax/nn/qrnn.hpp"

namespace olmax::nn {

template <class Strategy = scan::sequential_vectorized, Real T = float>
using QRNNBlock = Sandwich<QRNN<Strategy, T>>;

}  // namespace olmax::nn
