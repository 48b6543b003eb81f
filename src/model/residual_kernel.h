// The block's residual sum after dropout, x + branch * mask, as one loop: each element is the
// product rounded to float and then the sum rounded to float, the two IEEE operations ATen's mul
// and add_ perform one after the other. The file is compiled with -ffp-contract=off, so no build
// turns the pair into a fused multiply-add (which rounds once and gives other bits).
//
// Torch-free.
#pragma once

#include <cstdint>

namespace retrace::model {

// out[i] = branch[i] * mask[i] + x[i] for i in [0, n), rounding after the product and after the
// sum. out may alias branch or x.
void dropout_residual_forward(const float* branch, const float* mask, const float* x, float* out, int64_t n);

}  // namespace retrace::model
