// The GPT's LayerNorm and token + position embedding under portable numerics version 2 (issue 51):
// autograd Functions over kernels/reduce.h and row copies, the same bits at any lane count and on
// both LibTorch builds, where ATen's native_layer_norm and embedding_dense_backward are each
// build's own. Used where owned_kernels() is on and the tensors are float32 CPU (int64 ids) outside
// autocast; LibTorch's modules elsewhere. The modules stay the holders of the parameters.
#pragma once

#include <ATen/core/Tensor.h>

namespace retrace::model {

// LayerNorm over the last dimension of x with weight and bias of its size (both defined: an
// elementwise-affine LayerNorm, as the GPT's): kernels::layer_norm_row per row on the lanes; backward per row, and the weight's and
// bias's gradients as column sums over the rows in order, in double.
bool owned_layer_norm_applies(const at::Tensor& x, const at::Tensor& weight);
at::Tensor owned_layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps);

// wte[ids[b, t]] + wpe[t] for ids [B, T] (T at most wpe's rows): one rounded add per element, as
// LibTorch's. Backward: wte's gradient adds the rows of the output gradient into the rows of their
// ids in (b, t) order, wpe's sums each position over the batch in order; column tiles on the lanes.
bool owned_embedding_applies(const at::Tensor& ids, const at::Tensor& wte, const at::Tensor& wpe);
at::Tensor owned_embedding(const at::Tensor& ids, const at::Tensor& wte, const at::Tensor& wpe);

}  // namespace retrace::model
