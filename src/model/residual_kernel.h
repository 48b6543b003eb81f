// The block's residual sum after a linear layer and dropout, x + dropout(gemm + bias), as one loop:
// each element is the bias sum rounded to float, then the product with the mask rounded, then the
// residual sum rounded: the three IEEE operations LibTorch's linear (its in-place bias add after
// the GEMM), dropout's mul and the residual add_ perform one after the other. The file is
// compiled with -ffp-contract=off, so no build turns a product and a sum into a fused
// multiply-add (which rounds once and gives other bits).
//
// Torch-free.
#pragma once

#include <cstdint>

namespace retrace::model {

// For rows x cols row-major arrays: out[r, c] = ((branch[r, c] + bias[c]) * mask[r, c]) + x[r, c],
// each operation rounded; without the bias sum when bias is null. out may alias branch or x.
void dropout_residual_forward(const float* branch, const float* bias, const float* mask, const float* x, float* out,
                              int64_t rows, int64_t cols);

}  // namespace retrace::model
