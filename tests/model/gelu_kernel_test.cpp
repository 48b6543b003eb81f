// retrace's own GELU (model/gelu_kernel.h): its accuracy against double precision over every
// float in a wide range, the same bits from the AVX2 build of its loops and the baseline build
// (over a stride through all 2^32 bit patterns, specials included), and its gradient against the
// derivative of x * Phi(x) computed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "model/gelu_kernel.h"

namespace retrace::model {
namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

double phi_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }
double phi_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI); }

// Floats with |x| in [2^-20, 13], both signs: every 97th bit pattern of the range (all of them,
// 4e8, would take too long), 4 million values across every exponent.
std::vector<float> sweep() {
  std::vector<float> xs;
  for (uint32_t b = bits(std::ldexp(1.0f, -20)); b <= bits(13.0f); b += 97) {
    xs.push_back(from_bits(b));
    xs.push_back(-from_bits(b));
  }
  return xs;
}

TEST(GeluKernel, ForwardIsCloseToDoublePrecision) {
  const std::vector<float> xs = sweep();
  std::vector<float> y(xs.size());
  gelu_forward(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
  double worst = 0;
  float at = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double want = static_cast<double>(xs[i]) * phi_cdf(xs[i]);
    if (std::fabs(want) < 1e-30) continue;
    const double rel = std::fabs(y[i] - want) / std::fabs(want);
    if (rel > worst) worst = rel, at = xs[i];
  }
  // 8 units in the last place of a float (2^-24 each); the worst measured is 6.1, near x = -1.5,
  // where the tail's rounding errors (exp, polynomial, w) add up.
  EXPECT_LT(worst, 8 * std::ldexp(1.0, -24)) << "worst relative error " << worst << " at x = " << at;
  std::printf("gelu forward: worst relative error %.3g (%.2f ulp) at x = %.9g over %zu values\n", worst,
              worst / std::ldexp(1.0, -24), at, xs.size());
}

TEST(GeluKernel, BackwardIsCloseToDoublePrecision) {
  const std::vector<float> xs = sweep();
  std::vector<float> ones(xs.size(), 1.0f), dx(xs.size());
  gelu_backward(ones.data(), xs.data(), dx.data(), static_cast<int64_t>(xs.size()));
  double worst = 0;
  float at = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double x = xs[i];
    const double want = phi_cdf(x) + x * phi_pdf(x);
    // Relative to the size of the two terms: near the derivative's zero (x = -0.75179) they cancel.
    const double err = std::fabs(dx[i] - want) / (phi_cdf(x) + std::fabs(x) * phi_pdf(x));
    if (err > worst) worst = err, at = xs[i];
  }
  EXPECT_LT(worst, 1e-6) << "worst error " << worst << " at x = " << at;
  std::printf("gelu backward: worst error %.3g at x = %.9g over %zu values\n", worst, at, xs.size());
}

TEST(GeluKernel, LimitsAndSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{0.0f, -0.0f, 13.0f, -13.0f, 100.0f, -100.0f, 1e-30f, -1e-30f, 1e-45f, inf, -inf, nan};
  std::vector<float> y(xs.size()), dx(xs.size()), ones(xs.size(), 1.0f);
  gelu_forward(xs.data(), y.data(), static_cast<int64_t>(xs.size()));
  gelu_backward(ones.data(), xs.data(), dx.data(), static_cast<int64_t>(xs.size()));
  EXPECT_EQ(bits(y[0]), bits(0.0f));
  EXPECT_EQ(bits(y[1]), bits(-0.0f));
  EXPECT_EQ(y[2], 13.0f);
  EXPECT_EQ(y[3], 0.0f);  // flushed: the true value is -1.6e-37
  EXPECT_EQ(y[4], 100.0f);
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_FLOAT_EQ(y[6], 0.5e-30f);
  EXPECT_FLOAT_EQ(y[7], -0.5e-30f);
  EXPECT_EQ(y[9], inf);
  EXPECT_TRUE(std::isnan(y[10]));  // -inf * 0, as LibTorch's GELU gives
  EXPECT_TRUE(std::isnan(y[11]));
  EXPECT_FLOAT_EQ(dx[0], 0.5f);
  EXPECT_EQ(dx[2], 1.0f);
  EXPECT_EQ(dx[3], 0.0f);
  EXPECT_EQ(dx[9], 1.0f);
  EXPECT_TRUE(std::isnan(dx[11]));
}

TEST(GeluKernel, VectorAndBaselineLoopsAgreeBitwise) {
  // A stride through every bit pattern (NaNs, infinities, subnormals, both zeros), in a length
  // that leaves a scalar tail, forward and backward with varied upstream gradients.
  std::vector<float> xs, dy;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 251) xs.push_back(from_bits(static_cast<uint32_t>(b)));
  for (size_t i = 0; i < xs.size(); ++i)
    dy.push_back(from_bits(0x3f800000u ^ static_cast<uint32_t>(i * 2654435761u) >> 9));
  xs.push_back(1.0f), xs.push_back(-2.5f), dy.push_back(0.25f), dy.push_back(-3.0f);
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<float> y1(n), y2(n), d1(n), d2(n);
  gelu_forward(xs.data(), y1.data(), n, true);
  gelu_forward(xs.data(), y2.data(), n, false);
  gelu_backward(dy.data(), xs.data(), d1.data(), n, true);
  gelu_backward(dy.data(), xs.data(), d2.data(), n, false);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool nan1 = std::isnan(y1[i]) && std::isnan(y2[i]), nan2 = std::isnan(d1[i]) && std::isnan(d2[i]);
    differ += (!nan1 && bits(y1[i]) != bits(y2[i])) + (!nan2 && bits(d1[i]) != bits(d2[i]));
  }
  EXPECT_EQ(differ, 0) << "of " << n << " values, kernel " << gelu_kernel_isa();
}

}  // namespace
}  // namespace retrace::model
