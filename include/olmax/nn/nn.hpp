#pragma once
// Module header: layers as template types, reversible blocks and depth stacking.
#include "olmax/nn/contract.hpp"
#include "olmax/nn/parameters.hpp"
#include "olmax/nn/init.hpp"
#include "olmax/nn/views.hpp"
#include "olmax/nn/activation.hpp"
#include "olmax/nn/linear.hpp"
#include "olmax/nn/norm.hpp"
#include "olmax/nn/conv.hpp"
#include "olmax/nn/reversible.hpp"
#include "olmax/nn/stack.hpp"
