// Dropout for the models. "philox" (the default): one 64-bit draw from torch's default CPU
// generator keys a Philox4x32-10 mask (rng::dropout_mask), about 10x faster than LibTorch's CPU
// bernoulli, which calls the generator once per element. The only random state is still torch's
// CPU generator, so RngState capture, checkpoints and activation checkpointing's recompute (which
// swaps that generator's state) cover it unchanged. "torch": LibTorch's dropout, what retrace used
// before model.dropout_impl existed (recorded runs without the key replay with it). Tensors not on
// the CPU always use LibTorch's dropout (its device generator, e.g. CUDA Philox).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "model/options.h"

namespace retrace::model {

// One philox dropout mask: its key (one 64-bit draw from torch's default CPU generator), drop
// threshold and keep scale 1 / (1 - p), the scale computed in float as LibTorch does.
struct PhiloxMask {
  uint64_t key = 0;
  uint32_t threshold = 0;
  float keep_scale = 1.0f;
};
// nullopt (and no draw) when not training or p == 0; ConfigError unless 0 <= p < 1.
std::optional<PhiloxMask> draw_philox_mask(double p, bool training);
// Elements [begin, end) of the mask into out[0, end - begin); begin a multiple of 4.
void fill_philox_mask(const PhiloxMask& m, float* out, int64_t begin, int64_t end);

// x * mask, mask elements 0 (probability p) or 1 / (1 - p); x itself when not training or p == 0.
at::Tensor dropout(const at::Tensor& x, double p, bool training, DropoutImpl impl);

}  // namespace retrace::model
