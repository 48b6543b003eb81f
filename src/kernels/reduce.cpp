#include "kernels/reduce.h"

#include <algorithm>
#include <cmath>

namespace retrace::kernels {

double sum_squares(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  double acc[kLanes] = {};
  int64_t i = 0;
  // Each accumulator is its own chain of additions, so the compiler may put them in vector
  // registers side by side without changing one rounding.
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double v = x[i + j];
      acc[j] += v * v;
    }
  for (int j = 0; i + j < n; ++j) {
    const double v = x[i + j];
    acc[j] += v * v;
  }
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0];
}

double log_sum_exp(const float* x, int64_t n) {
  const float m = *std::max_element(x, x + n);
  if (!std::isfinite(m)) return static_cast<double>(m);  // inf or nan: the loss is too
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(static_cast<double>(x[j]) - m);
  return m + std::log(s);
}

void cross_entropy_row_grad(const float* x, int64_t n, double lse, int64_t target, double scale, float* g) {
  for (int64_t j = 0; j < n; ++j) {
    const double p = std::exp(static_cast<double>(x[j]) - lse);
    g[j] = static_cast<float>(scale * (j == target ? p - 1.0 : p));
  }
}

void softmax_row(const float* x, int64_t valid, int64_t n, float* y, double* scratch) {
  const float m = *std::max_element(x, x + valid);
  double s = 0.0;
  for (int64_t j = 0; j < valid; ++j) {
    scratch[j] = std::exp(static_cast<double>(x[j]) - m);
    s += scratch[j];
  }
  for (int64_t j = 0; j < valid; ++j) y[j] = static_cast<float>(scratch[j] / s);
  std::fill(y + valid, y + n, 0.0f);
}

void softmax_backward_row(const float* y, const float* gy, int64_t valid, int64_t n, float* gx) {
  double dot = 0.0;
  for (int64_t j = 0; j < valid; ++j) dot += static_cast<double>(gy[j]) * y[j];
  for (int64_t j = 0; j < valid; ++j) gx[j] = static_cast<float>(static_cast<double>(y[j]) * (gy[j] - dot));
  std::fill(gx + valid, gx + n, 0.0f);
}

void layer_norm_row(const float* x, int64_t n, double eps, const float* gamma, const float* beta, float* y,
                    double* mean, double* rstd) {
  double s = 0.0;
  for (int64_t j = 0; j < n; ++j) s += x[j];
  const double mu = s / static_cast<double>(n);
  double v = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double c = x[j] - mu;
    v += c * c;
  }
  const double r = 1.0 / std::sqrt(v / static_cast<double>(n) + eps);
  for (int64_t j = 0; j < n; ++j) {
    const double h = (x[j] - mu) * r;
    const double scaled = gamma ? h * gamma[j] : h;
    y[j] = static_cast<float>(beta ? scaled + beta[j] : scaled);
  }
  *mean = mu;
  *rstd = r;
}

void layer_norm_backward_row(const float* x, const float* gy, int64_t n, const float* gamma, double mean, double rstd,
                             float* gx) {
  double sg = 0.0, sgh = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const double g = gamma ? static_cast<double>(gy[j]) * gamma[j] : gy[j];
    sg += g;
    sgh += g * ((x[j] - mean) * rstd);
  }
  const double mg = sg / static_cast<double>(n), mgh = sgh / static_cast<double>(n);
  for (int64_t j = 0; j < n; ++j) {
    const double g = gamma ? static_cast<double>(gy[j]) * gamma[j] : gy[j];
    gx[j] = static_cast<float>(rstd * (g - mg - (x[j] - mean) * rstd * mgh));
  }
}

}  // namespace retrace::kernels
