// The linear layers of retrace's own models under portable numerics version 2: y = x W^T (+ b) and
// its backward on kernels::gemm (BLIS, its own threads, the same bits at any thread count), as an
// autograd Function. Version 1 and native keep LibTorch's linear (ATen's addmm / matmul on the
// BLAS libtorch links), so their bits do not move.
//
// The path is process-wide, set by train::apply_environment from the config (like the lanes): the
// models ask owned_linear_applies and call owned_linear or LibTorch's linear. Only float32 CPU
// tensors outside autocast take it; anything else (CUDA, bf16 under CPU autocast) keeps ATen's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace retrace::model {

enum class GemmPath : uint8_t { kAten, kOwned };
void set_gemm_path(GemmPath path);
GemmPath gemm_path();
// Whether version 2's kernels are on (the GEMM path is the owned one): the loss (owned_loss.h) and
// the gradient norm (train/step.cpp) follow it too.
inline bool owned_kernels() { return gemm_path() == GemmPath::kOwned; }

// Whether t is a tensor version 2's CPU kernels compute on: defined, float32, CPU, strided.
inline bool owned_float(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided;
}

// Whether owned_linear takes x [..., K] and weight [N, K]: the owned path is on, both float32 CPU
// strided tensors, and CPU autocast is off.
bool owned_linear_applies(const at::Tensor& x, const at::Tensor& weight);

// x W^T, then + bias (a float32 [N], or undefined for none) as one rounded add per element, as
// LibTorch's linear adds it. Backward: dX = dY W and dW = dY^T X, each one GEMM with the transposes
// as strides; db the column sums of dY in bias_gradient's order (fused.h). Inputs that need no
// gradient get none computed.
at::Tensor owned_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace retrace::model
