#include "model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/dropout.h>
#include <torch/torch.h>

#include <mutex>

#include "core/error.h"
#include "model/lanes.h"
#include "rng/philox.h"

namespace retrace::model {

uint64_t next_dropout_key() {
  auto* gen = at::check_generator<at::CPUGeneratorImpl>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->random64();
}

// LibTorch scales its mask by dividing 1 by (1 - p) in float; the same value here.
float dropout_keep_scale(double p) { return 1.0f / static_cast<float>(1.0 - p); }

at::Tensor dropout(const at::Tensor& x, double p, bool training, DropoutImpl impl) {
  if (!training || p == 0.0) return x;
  RETRACE_CHECK(p > 0.0 && p < 1.0, ConfigError, "bad value for model.dropout: ", p, " (need 0 <= dropout < 1)");
  if (impl == DropoutImpl::kTorch || !x.device().is_cpu())
    return torch::nn::functional::dropout(x, torch::nn::functional::DropoutFuncOptions().p(p).training(true));
  const uint64_t key = next_dropout_key();
  const uint32_t threshold = rng::dropout_threshold(p);
  const float keep_scale = dropout_keep_scale(p);
  at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kFloat).requires_grad(false));
  float* out = mask.data_ptr<float>();
  const int64_t n = mask.numel();
  // The mask is a function of the element index: two lanes fill two ranges of one mask. Below
  // 256k elements (the GPT's [batch, context, d_model] at the char GPT's shapes) the helper's
  // wake-up costs about what it saves: the MLP's masks (64k and 32k) measured no faster.
  if (n < (int64_t{1} << 18)) {
    rng::dropout_mask(key, threshold, keep_scale, out, n);
  } else {
    const int64_t half = (n / 2) & ~int64_t{63};
    run_lanes([&](int lane) {
      const int64_t begin = lane == 0 ? 0 : half, end = lane == 0 ? half : n;
      rng::dropout_mask_range(key, threshold, keep_scale, out + begin, begin, end);
    });
  }
  if (x.scalar_type() != at::kFloat) mask = mask.to(x.scalar_type());
  return x * mask;
}

}  // namespace retrace::model
