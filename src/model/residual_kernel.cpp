#include "model/residual_kernel.h"

namespace retrace::model {

void dropout_residual_forward(const float* branch, const float* bias, const float* mask, const float* x, float* out,
                              int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t o = r * cols;
    if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) {
        const float biased = branch[o + c] + bias[c];
        const float dropped = biased * mask[o + c];
        out[o + c] = dropped + x[o + c];
      }
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const float dropped = branch[o + c] * mask[o + c];
        out[o + c] = dropped + x[o + c];
      }
    }
  }
}

}  // namespace retrace::model
