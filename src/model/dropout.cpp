#include "model/dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/dropout.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "model/chunk_layout.h"
#include "model/lanes.h"
#include "rng/philox.h"

namespace retrace::model {
namespace {
// The mask of probability p keyed by one 64-bit draw from `generator` (a CPU generator).
PhiloxMask philox_mask_from(const at::Generator& generator, double p) {
  PhiloxMask m;
  {
    auto* gen = at::check_generator<at::CPUGeneratorImpl>(generator);
    std::lock_guard<std::mutex> lock(gen->mutex_);
    m.key = gen->random64();
  }
  m.threshold = rng::dropout_threshold(p);
  m.keep_scale = 1.0f / static_cast<float>(1.0 - p);
  return m;
}

// Batch invariance in one piece (chunk_layout.h): chunk c's rows get the mask the piecewise path
// gives chunk c alone, keyed by chunk c's generator, element indices counted from the chunk's start.
void fill_chunked_mask(const ChunkLayout& layout, double p, at::Tensor& mask) {
  RETRACE_CHECK(mask.dim() >= 1 && mask.size(0) == layout.samples, InvariantError, "dropout: a tensor of ",
                mask.sizes(), " inside a micro-batch of ", layout.samples, " samples");
  const int64_t chunks = layout.chunks();
  const int64_t per = mask.numel() / chunks;
  std::vector<PhiloxMask> masks;
  for (const at::Generator& g : layout.generators) masks.push_back(philox_mask_from(g, p));
  float* out = mask.data_ptr<float>();
  // Whole chunks per tile, about 128k elements (one chunk at least).
  for_each_tile(chunks, std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(per, 1)),
                [&](int64_t c0, int64_t c1, int) {
                  for (int64_t c = c0; c < c1; ++c) fill_philox_mask(masks[c], out + c * per, 0, per);
                });
}
}  // namespace

std::optional<PhiloxMask> draw_philox_mask(double p, bool training) {
  if (!training || p == 0.0) return std::nullopt;
  RETRACE_CHECK(p > 0.0 && p < 1.0, ConfigError, "bad value for model.dropout: ", p, " (need 0 <= dropout < 1)");
  return philox_mask_from(at::detail::getDefaultCPUGenerator(), p);
}

void fill_philox_mask(const PhiloxMask& m, float* out, int64_t begin, int64_t end) {
  rng::dropout_mask_range(m.key, m.threshold, m.keep_scale, out, begin, end);
}

at::Tensor dropout(const at::Tensor& x, double p, bool training, DropoutImpl impl) {
  if (!training || p == 0.0) return x;
  RETRACE_CHECK(p > 0.0 && p < 1.0, ConfigError, "bad value for model.dropout: ", p, " (need 0 <= dropout < 1)");
  if (impl == DropoutImpl::kTorch || !x.device().is_cpu())
    return torch::nn::functional::dropout(x, torch::nn::functional::DropoutFuncOptions().p(p).training(true));
  at::Tensor mask = at::empty(x.sizes(), x.options().dtype(at::kFloat).requires_grad(false));
  if (const ChunkLayout* layout = chunk_layout()) {
    fill_chunked_mask(*layout, p, mask);
    if (x.scalar_type() != at::kFloat) mask = mask.to(x.scalar_type());
    return x * mask;
  }
  const PhiloxMask m = *draw_philox_mask(p, training);
  float* out = mask.data_ptr<float>();
  // The mask is a function of the element index, so lanes fill tiles of one mask. A mask of at
  // most 128k elements is one tile, filled by the caller: for the MLP's (64k and 32k) the helper's
  // wake-up cost about what it saved; the GPT's [batch, context, d_model] (256k) is two.
  for_each_tile(mask.numel(), int64_t{1} << 17, [&](int64_t b, int64_t e, int) { fill_philox_mask(m, out + b, b, e); });
  if (x.scalar_type() != at::kFloat) mask = mask.to(x.scalar_type());
  return x * mask;
}

}  // namespace retrace::model
