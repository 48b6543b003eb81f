#include "model/residual_kernel.h"

namespace retrace::model {

void dropout_residual_forward(const float* branch, const float* mask, const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float dropped = branch[i] * mask[i];
    out[i] = dropped + x[i];
  }
}

}  // namespace retrace::model
