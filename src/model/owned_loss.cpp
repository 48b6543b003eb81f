#include "model/owned_loss.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include <vector>

#include "core/error.h"
#include "core/torch_compat.h"
#include "kernels/reduce.h"
#include "model/chunk_layout.h"
#include "model/lanes.h"
#include "model/owned_linear.h"

namespace retrace::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Rows per tile on the lanes: about 64k logits, at least one row.
int64_t rows_per_tile(int64_t classes) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(classes, 1));
}

struct OwnedCrossEntropySum : torch::autograd::Function<OwnedCrossEntropySum> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits_in, const at::Tensor& targets_in) {
    RECORD_FUNCTION("retrace::cross_entropy", std::vector<c10::IValue>());
    const at::Tensor logits = logits_in.contiguous();
    const at::Tensor targets = targets_in.contiguous();
    const int64_t rows = logits.size(0), classes = logits.size(1);
    const float* x = logits.data_ptr<float>();
    const int64_t* t = targets.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r)
      RETRACE_CHECK(t[r] >= 0 && t[r] < classes, ConfigError, "cross-entropy: the target of row ", r, " is ", t[r],
                    ", outside the model's ", classes,
                    " classes; the data set's labels must be below the model's output size");
    at::Tensor lse = at::empty({rows}, logits.options().dtype(at::kDouble));
    double* l = lse.data_ptr<double>();
    for_each_tile(rows, rows_per_tile(classes), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) l[r] = kernels::log_sum_exp(x + r * classes, classes);
    });
    // Batch invariance in one piece (chunk_layout.h): one sum per chunk, each chunk's rows in order.
    const ChunkLayout* layout = chunk_layout();
    const int64_t chunks = layout ? layout->chunks() : 1;
    const int64_t per_chunk = rows_per_chunk(rows, chunks);
    at::Tensor sums = at::empty({chunks}, logits.options());
    for (int64_t c = 0; c < chunks; ++c) {
      double total = 0.0;  // rows in order
      for (int64_t r = c * per_chunk; r < (c + 1) * per_chunk; ++r)
        total += l[r] - static_cast<double>(x[r * classes + t[r]]);
      sums.data_ptr<float>()[c] = static_cast<float>(total);
    }
    ctx->save_for_backward({logits, targets, lse});
    return layout ? sums : at::scalar_tensor(sums.data_ptr<float>()[0], logits.options());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    RECORD_FUNCTION("retrace::cross_entropy_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const int64_t rows = logits.size(0), classes = logits.size(1);
    // One incoming gradient per chunk (one in all outside batch invariance's one-piece path).
    const at::Tensor scales = grads[0].to(at::kFloat).contiguous().view({-1});
    const float* scale = scales.data_ptr<float>();
    const int64_t per_chunk = rows_per_chunk(rows, scales.numel());
    at::Tensor g = at::empty_like(logits);
    const float* x = logits.data_ptr<float>();
    const int64_t* t = saved[1].data_ptr<int64_t>();
    const double* l = saved[2].data_ptr<double>();
    float* out = g.data_ptr<float>();
    for_each_tile(rows, rows_per_tile(classes), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        kernels::cross_entropy_row_grad(x + r * classes, classes, l[r], t[r], scale[r / per_chunk], out + r * classes);
    });
    return {g, at::Tensor()};
  }
};

}  // namespace

bool owned_cross_entropy_applies(const at::Tensor& logits, const at::Tensor& targets) {
  return owned_kernels() && owned_float(logits) && targets.defined() && logits.dim() == 2 && targets.dim() == 1 &&
         logits.size(0) == targets.size(0) && logits.size(1) >= 1 && targets.device().is_cpu() &&
         targets.scalar_type() == at::kLong && !compat::cpu_autocast_enabled();
}

at::Tensor owned_cross_entropy_sum(const at::Tensor& logits, const at::Tensor& targets) {
  RETRACE_CHECK(owned_cross_entropy_applies(logits, targets), InvariantError,
                "owned_cross_entropy_sum: needs float32 CPU logits [rows, classes] and int64 targets [rows], got ",
                logits.sizes(), " and ", targets.sizes());
  return OwnedCrossEntropySum::apply(logits, targets);
}

}  // namespace retrace::model
