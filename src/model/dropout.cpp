#include "model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/dropout.h>
#include <torch/torch.h>

#include <mutex>

#include "core/error.h"
#include "rng/philox.h"

namespace retrace::model {

at::Tensor dropout(const at::Tensor& x, double p, bool training, DropoutImpl impl) {
  if (!training || p == 0.0) return x;
  RETRACE_CHECK(p > 0.0 && p < 1.0, ConfigError, "bad value for model.dropout: ", p, " (need 0 <= dropout < 1)");
  if (impl == DropoutImpl::kTorch || !x.device().is_cpu())
    return torch::nn::functional::dropout(x, torch::nn::functional::DropoutFuncOptions().p(p).training(true));
  uint64_t key = 0;
  {
    auto* gen = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
    std::lock_guard<std::mutex> lock(gen->mutex_);
    key = gen->random64();
  }
  // LibTorch scales its mask by dividing 1 by (1 - p) in float; the same value here.
  const float keep_scale = 1.0f / static_cast<float>(1.0 - p);
  at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kFloat).requires_grad(false));
  rng::dropout_mask(key, rng::dropout_threshold(p), keep_scale, mask.data_ptr<float>(), mask.numel());
  if (x.scalar_type() != at::kFloat) mask = mask.to(x.scalar_type());
  return x * mask;
}

}  // namespace retrace::model
