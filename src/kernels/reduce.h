// Reductions of portable numerics version 2 (issue 51), in an order fixed by the source: the same
// bits at any thread count, on both LibTorch builds, on every x86-64-v3 CPU. Torch-free; compiled
// with -ffp-contract=off, so no multiply-add is fused that the source does not spell.
//
// ATen's reductions split their sums by its thread count and change between releases (its norm
// and log_softmax kernels differ between 1.13 and 2.x); these are what version 2 computes instead.
#pragma once

#include <cstdint>

namespace retrace::kernels {

// sum of x[i]^2 in double: element i into accumulator i % 16 in index order, the 16 combined by a
// fixed pairwise tree. Exact products (a float squared is exact in double); the sum's rounding is
// the order's. n >= 0.
double sum_squares(const float* x, int64_t n);

// log(sum_j exp(x[j])) of one row, in double: m = max_j x[j], then m + log(sum_j exp(x[j] - m)),
// the sum in index order, exp and log libm's (the C library is a numerics field of the
// fingerprint). n >= 1.
double log_sum_exp(const float* x, int64_t n);

// The gradient of cross-entropy's row loss lse - x[target] times `scale`:
// g[j] = float(scale * (exp(x[j] - lse) - [j == target])).
void cross_entropy_row_grad(const float* x, int64_t n, double lse, int64_t target, double scale, float* g);

// Softmax of the first `valid` entries of a row of n (the rest, a causal mask's, get 0):
// e_j = exp(x[j] - m) in double (libm's exp), m their maximum, s = sum_j e_j in index order,
// y[j] = float(e_j / s). `scratch` holds at least `valid` doubles. 1 <= valid <= n.
void softmax_row(const float* x, int64_t valid, int64_t n, float* y, double* scratch);

// Softmax's backward for such a row: gx[j] = float(y[j] * (gy[j] - sum_k gy[k] y[k])) for
// j < valid, the sum over k < valid in index order, in double; 0 beyond.
void softmax_backward_row(const float* y, const float* gy, int64_t valid, int64_t n, float* gx);

// LayerNorm of one row of n: mean and variance (population) in double, in index order (the
// variance from the centred values), rstd = 1 / sqrt(var + eps); y[j] = float(xhat_j * gamma[j] +
// beta[j]) with xhat_j = (x[j] - mean) * rstd in double; gamma and beta may be null (1 and 0).
// Writes the row's mean and rstd for the backward.
void layer_norm_row(const float* x, int64_t n, double eps, const float* gamma, const float* beta, float* y,
                    double* mean, double* rstd);

// LayerNorm's input gradient for one row: with g_j = gy[j] * gamma[j],
// gx[j] = float(rstd * (g_j - mean_k g_k - xhat_j * mean_k (g_k xhat_k))), the means in index order.
void layer_norm_backward_row(const float* x, const float* gy, int64_t n, const float* gamma, double mean, double rstd,
                             float* gx);

}  // namespace retrace::kernels
