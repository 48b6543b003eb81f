// The linear layer of portable numerics version 2 (model/owned_linear.h): the same bits at 1, 2, 3, 4
// and 8 lanes (its GEMMs cut into tiles by the lane count), and close to LibTorch's linear in value
// (another library's sums), forward and backward, with and without a bias, 2-d and 3-d inputs.
#include "model/owned_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/lanes.h"

namespace retrace::model {
namespace {

struct OwnedPath {
  int lanes_before = lanes();
  explicit OwnedPath(int n) {
    set_gemm_path(GemmPath::kOwned);
    set_lanes(n);
  }
  ~OwnedPath() {
    set_gemm_path(GemmPath::kAten);
    set_lanes(lanes_before);
  }
};

struct Grads {
  torch::Tensor y, gx, gw, gb;
};

// One forward and backward of owned_linear (owned = true) or LibTorch's linear.
Grads run(const torch::Tensor& x0, const torch::Tensor& w0, const torch::Tensor& b0, bool owned) {
  torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  torch::Tensor b = b0.defined() ? b0.clone().requires_grad_(true) : torch::Tensor();
  torch::Tensor y = owned ? owned_linear(x, w, b) : torch::nn::functional::linear(x, w, b);
  (y * y.detach().cos()).sum().backward();  // a non-uniform output gradient
  return {y.detach(), x.grad(), w.grad(), b.defined() ? b.grad() : torch::Tensor()};
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

struct Shape {
  std::vector<int64_t> x;
  int64_t out;
  bool bias;
};

TEST(OwnedLinear, SameBitsAtEveryLaneCountAndCloseToLibTorch) {
  torch::manual_seed(7);
  for (const Shape& s : {Shape{{128, 784}, 512, true}, Shape{{128, 256}, 10, true}, Shape{{4, 64, 128}, 384, false},
                         Shape{{3, 37, 129}, 77, true}, Shape{{1, 5}, 3, true}}) {
    const torch::Tensor x = torch::randn(s.x), w = torch::randn({s.out, s.x.back()}) * 0.05;
    const torch::Tensor b = s.bias ? torch::randn({s.out}) : torch::Tensor();
    Grads one;
    {
      OwnedPath p(1);
      ASSERT_TRUE(owned_linear_applies(x, w));
      one = run(x, w, b, true);
    }
    for (int n : {2, 3, 4, 8}) {
      OwnedPath p(n);
      const Grads g = run(x, w, b, true);
      EXPECT_TRUE(same_bits(g.y, one.y) && same_bits(g.gx, one.gx) && same_bits(g.gw, one.gw) &&
                  same_bits(g.gb, one.gb))
          << "lanes " << n << ", x " << x.sizes();
    }
    const Grads ref = run(x.to(torch::kDouble), w.to(torch::kDouble), b.defined() ? b.to(torch::kDouble) : b, false);
    EXPECT_TRUE(torch::allclose(one.y.to(torch::kDouble), ref.y, 1e-4, 1e-4)) << x.sizes();
    EXPECT_TRUE(torch::allclose(one.gx.to(torch::kDouble), ref.gx, 1e-4, 1e-4)) << x.sizes();
    EXPECT_TRUE(torch::allclose(one.gw.to(torch::kDouble), ref.gw, 1e-4, 1e-3)) << x.sizes();
    if (s.bias) {
      EXPECT_TRUE(torch::allclose(one.gb.to(torch::kDouble), ref.gb, 1e-4, 1e-3)) << x.sizes();
    }
  }
}

TEST(OwnedLinear, OnlyWhereTheOwnedPathIsOnAndTheTensorsAreFloatCpu) {
  const torch::Tensor x = torch::randn({4, 8}), w = torch::randn({3, 8});
  EXPECT_FALSE(owned_linear_applies(x, w));  // the path is off (version 1, native)
  OwnedPath p(2);
  EXPECT_TRUE(owned_linear_applies(x, w));
  EXPECT_FALSE(owned_linear_applies(x.to(torch::kDouble), w.to(torch::kDouble)));
  EXPECT_FALSE(owned_linear_applies(x.to(torch::kBFloat16), w.to(torch::kBFloat16)));
  EXPECT_FALSE(owned_linear_applies(x, torch::randn({3, 9})));
}

}  // namespace
}  // namespace retrace::model
