#pragma once
// Module header: layers as template types, reversible blocks and depth stacking.
#include "olmax/nn/contract.hpp"
#include "olmax/nn/parameters.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/nn/activation.hpp"
#include "olmax/nn/dropout.hpp"
#include "olmax/nn/linear.hpp"
#include "olmax/nn/norm.hpp"
#include "olmax/nn/conv.hpp"
#include "olmax/nn/mixer.hpp"
#include "olmax/nn/moe.hpp"
#include "olmax/nn/embedding.hpp"
#include "olmax/nn/reversible.hpp"
#include "olmax/nn/stack.hpp"
// The QRNN layer lives in its own header (scan engine); the block wrapper comes with it when present.
#if __has_include("olmax/nn/qrnn.hpp")
#include "olmax/nn/qrnn_block.hpp"
#endif
