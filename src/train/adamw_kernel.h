// One pass of AdamW over a float32 parameter, its gradient and its two moments, computing exactly
// what LibTorch's torch::optim::AdamW computes with its seven tensor operations (same roundings,
// same fused multiply-adds), so the fused optimizer and LibTorch's give the same bits. The test
// `torch_test FusedAdamW.*` checks that against LibTorch on every build.
//
// Torch-free: the file is compiled with -ffp-contract=off (no fused multiply-add the source does
// not spell) and -fno-math-errno (so sqrt vectorizes; the moment is never negative).
#pragma once

#include <cstdint>

#include "core/digest.h"

namespace retrace::train {

// The scalars of one AdamW update, rounded to float the way LibTorch's kernels round them.
struct AdamWCoefficients {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float sqrt_bias_correction2;  // sqrt(1 - beta2^step)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^step)
};

AdamWCoefficients adamw_coefficients(double lr, double beta1, double beta2, double eps, double weight_decay,
                                     int64_t step);

// p, g, m, v: n floats each, not overlapping. Per element, in this order:
//   p *= decay; m = fma(g, 1-beta1, m*beta1); v = fma((1-beta2)*g, g, v*beta2);
//   p = p + (neg_step_size * m) / (sqrt(v) / sqrt_bias_correction2 + eps)
// allow_simd = false forces the baseline build of the loop (tests compare the two).
// sums (three, or nullptr): receive the lane sums (core/digest.h) of the new p, m and v, taken
// chunk by chunk while the chunk is still in the cache: the digests of parameters and optimizer
// state without reading them again.
// grad_scale (or nullptr): clipping's coefficient, applied first: g = g * grad_scale, stored back
// into g, the bits of g.mul_(coef) with grad_scale = float(coef) (ATen rounds a double scalar to
// the tensor's float). The loop is bound by its divisions and square roots, so the product and its
// store come almost free, where clipping on its own is another pass over every gradient.
// mixed (four, or nullptr): receive, added to what they hold, the mixed sums (core/digest.h) of
// the new p, m and v and of the gradient as used (after grad_scale), element i at global position
// first_position + i, chunk by chunk from the cache as the lane sums are (trace.digest_version 3,
// or 4 with mix = Mix::kHalves).
void adamw_update(float* p, float* g, float* m, float* v, int64_t n, const AdamWCoefficients& c, bool allow_simd = true,
                  LaneSums* sums = nullptr, const float* grad_scale = nullptr, uint64_t* mixed = nullptr,
                  uint64_t first_position = 0, Mix mix = Mix::kFmix64);

// The instruction set adamw_update runs with on this CPU: "avx2+fma" or "generic". Both give the
// same bits (a fused multiply-add is correctly rounded in hardware and in libm).
const char* adamw_kernel_isa();

}  // namespace retrace::train
