// The GPT block's elementwise work as single autograd functions, computed tile by tile and split
// across lanes (model/lanes.h), with the bits of the ops they replace (the GELU under
// model.gelu_impl = "retrace" has model/gelu_kernel.h's bits instead, the same for any tiles).
//
// Why the bits are the same, at every lane count and tile size:
// - ATen runs an elementwise kernel over a contiguous tensor as one loop: blocks of two vectors
//   (16 floats under AVX2, 32 under AVX-512) from the start, then the last elements one at a time,
//   and the scalar path of an op like GELU's erf need not round like the vector path. Tiles start
//   at multiples of 64 elements, so every element takes the path it takes in the whole-tensor
//   call.
// - Softmax and its backward compute each row on its own: tiles hold whole rows.
// - A multiply, a select and the dropout mask (a function of the element index) are written by
//   hand: one IEEE operation per element, the same in any order; dropout's product and the
//   residual sum after it are two, each rounded (model/residual_kernel.h).
// - The attention heads' layout changes are copies, with no arithmetic.
// fused_test checks forward and backward bitwise against the ops they replace, at one and two
// lanes, on shapes whose sizes are not multiples of 16.
//
// Used only for contiguous float32 CPU tensors (fused_applies); anything else (CUDA, bf16 under
// autocast) takes the plain ops. The functions that draw a dropout mask (the attention weights,
// dropout_residual) also need retrace's own dropout (DropoutImpl::kPhilox); the GELU, the heads'
// layout changes and the bias sums do not.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "model/options.h"

namespace retrace::model {

// True when the fused functions below take x: a contiguous float32 CPU tensor. (The attention
// weights also need DropoutImpl::kPhilox: LibTorch's dropout draws its own mask.)
bool fused_applies(const at::Tensor& x);

// Whether lanes_bmm takes a @ b: float32 CPU tensors of at least 3 dimensions with equal batch
// dimensions (no broadcasting) and a's last size b's second last, outside CPU autocast (where
// matmul computes in the lower precision).
bool lanes_bmm_applies(const at::Tensor& a, const at::Tensor& b);

// a [..., M, K] @ b [..., K, N] as torch::matmul computes it for such tensors (a batched matmul of
// the inputs reshaped, as matmul reshapes them, to [n, M, K] and [n, K, N]), but with OpenBLAS on
// one thread (OneBlasThread) and the n matrices split between the two lanes; backward is the same
// two batched matmuls as bmm's (grad @ b^T, a^T @ grad, on the same layouts), also on the lanes.
// Each matrix is one single-threaded BLAS call whichever lane makes it, so the bits are those of
// matmul with OpenBLAS on one thread, for any lane count. (ATen's bmm with OpenBLAS on two threads
// gains almost nothing at attention's sizes: 1.05 ms against 1.03 for the char GPT's
// [64, 128, 32] @ [64, 32, 128], against about 0.6 split between two threads.)
at::Tensor lanes_bmm(const at::Tensor& a, const at::Tensor& b);

// a [n, M, K] @ b [n, K, N] (any strides, as at::bmm takes them), no autograd: at::bmm_out on
// slices of the batch, taken in turn by the two lanes, with OpenBLAS on one thread. Each matrix is
// the one BLAS call ATen's bmm makes for it (it loops over the batch), so any split and either
// lane give the same bits; under MKL, whose batched GEMM ATen calls instead, no slice is a single
// matrix of several (a batch of one takes MKL's other GEMM: fused.cpp). lanes_bmm's forward and
// backward run on it; limit_bench times it.
at::Tensor bmm_on_lanes(const at::Tensor& a, const at::Tensor& b);

// scores [..., T, T] (query rows, key columns) -> dropout(softmax(masked_fill(scores * scale,
// causal, -inf)), p): the attention weights. Draws one 64-bit key from torch's CPU generator when
// training with p > 0, as model::dropout does. Saves the softmax output and the dropout mask for
// backward, as the plain ops do; scores is not saved.
at::Tensor causal_attention_weights(const at::Tensor& scores, double scale, double p, bool training);

// GELU (erf form) on a tensor fused_applies takes, tile by tile on the lanes; saves x for
// backward, as torch::gelu does. kTorch: LibTorch's bits (at::gelu on each tile); kRetrace:
// model/gelu_kernel.h's.
at::Tensor fused_gelu(const at::Tensor& x, GeluImpl impl = GeluImpl::kTorch);

// gelu(x + bias): x a linear layer's GEMM without its bias (a float32 vector of x's last size),
// the sum rounded once per element as linear's in-place bias add, then fused_gelu; saves x + bias
// for backward, and gives the bias at::sum_to of the GELU's input gradient (the engine's
// reduction). x as fused_applies takes.
at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, GeluImpl impl);

// at::sum_to(grad, {n}) for a gradient whose last size is n: the autograd engine's reduction for a
// bias broadcast over grad's leading dimensions. Where fused_applies(grad) and n >= 128, the two
// lanes sum a column range each, split where every column keeps the order of additions it has in
// the whole sum, so the bits are at::sum_to's.
// Under portable numerics version 2 (owned_kernels()), owned_column_sums instead.
at::Tensor bias_gradient(const at::Tensor& grad, int64_t n);

// The sums over rows of a contiguous float32 CPU gradient [..., n], column by column: the rows in
// order in double, rounded once to float; columns in tiles of 64 on the lanes. Version 2's bias
// and column reductions: the same bits at any lane count and on both LibTorch builds.
at::Tensor owned_column_sums(const at::Tensor& grad, int64_t n);
// Batch invariance in one piece (chunk_layout.h): the owned_column_sums of each of `chunks` equal
// runs of grad's rows, folded in float in chunk order into out [n] (written when `fresh`, else
// added to): bias_gradient chunk by chunk, added up, in one pass.
void fold_chunk_column_sums(const at::Tensor& grad, int64_t n, int64_t chunks, at::Tensor& out, bool fresh);

// GELU as model.gelu_impl asks: fused_gelu where fused_applies, torch::gelu anywhere else (CUDA,
// BF16 under autocast: there "retrace" is LibTorch's GELU too, as "philox" dropout is LibTorch's
// on CUDA).
at::Tensor gelu(const at::Tensor& x, GeluImpl impl);

// qkv [B, T, 3 * d] (a linear layer's output: q, k, v side by side, each h heads of dh = d / h)
// -> q [B, h, T, dh], k transposed [B, h, dh, T] and v [B, h, T, dh], contiguous: the values of
// qkv.split(d, -1)[i].view({B, T, h, dh}).transpose(1, 2) (k then .transpose(-2, -1)), copied once
// on the lanes. They are the layouts torch::matmul copies those strided views into before its
// batched GEMMs, so matmul(q, k_t) and matmul(att, v) make the same BLAS calls, forward and
// backward. (Not a contiguous k with k.transpose(-2, -1): the GEMMs' transpose flags then differ,
// and OpenBLAS's small-matrix kernels round differently; gpt_test's AttentionInPlace caught it.)
// Backward: the copies back, zeros for a part without gradient (split's backward).
// With a bias (3 * d floats), qkv is the projection's GEMM without it, and each copied element is
// qkv + bias rounded once, as LibTorch's linear adds it in place after the GEMM; backward gives
// the bias at::sum_to of the gradient, the autograd engine's reduction for that add.
std::array<at::Tensor, 3> split_heads(const at::Tensor& qkv, int64_t heads, const at::Tensor& bias = at::Tensor());

// y [B, h, T, dh] -> [B, T, h * dh]: y.transpose(1, 2).contiguous().view({B, T, h * dh}), copied
// on the lanes; backward the copy back.
at::Tensor merge_heads(const at::Tensor& y);

// x + dropout(branch + bias, p) in training, 0 < p < 1: branch a linear layer's GEMM without its
// bias (or an undefined bias: x + dropout(branch)), one Philox mask drawn as model::dropout draws
// it (one 64-bit key from torch's CPU generator), and each element the bias sum, the product and
// the residual sum each rounded, as linear's in-place bias add, mul and add_ compute them
// (model/residual_kernel.h). Saves the mask; backward gives branch grad * mask, the bias its
// at::sum_to, and x the gradient as is, as the three ops' backward functions and the engine do.
at::Tensor dropout_residual(const at::Tensor& branch, const at::Tensor& bias, const at::Tensor& x, double p);

}  // namespace retrace::model
