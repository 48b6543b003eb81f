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

#include "model/options.h"

namespace retrace::model {

// One 64-bit draw from torch's default CPU generator: the key of one philox dropout mask.
uint64_t next_dropout_key();
// The value a kept element is multiplied by: 1 / (1 - p), computed in float as LibTorch does.
float dropout_keep_scale(double p);

// x * mask, mask elements 0 (probability p) or 1 / (1 - p); x itself when not training or p == 0.
at::Tensor dropout(const at::Tensor& x, double p, bool training, DropoutImpl impl);

}  // namespace retrace::model
