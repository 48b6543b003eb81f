// model::dropout: the Philox mask keyed by one draw of torch's CPU generator, against the
// behaviour of LibTorch's dropout that it replaces (scaling, gradient, generator state).
#include "model/dropout.h"

#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace retrace::model {
namespace {

TEST(Dropout, PhiloxMaskScalesKeptElementsAndPassesTheSameMaskToTheGradient) {
  torch::manual_seed(1);
  auto x = torch::randn({64, 515}).requires_grad_();
  auto y = dropout(x, 0.2, /*training=*/true, DropoutImpl::kPhilox);
  const auto mask = y.detach() / x.detach();
  const float scale = 1.0f / static_cast<float>(1.0 - 0.2);
  const auto kept = mask != 0;
  EXPECT_TRUE(torch::allclose(mask.masked_select(kept), torch::full({}, scale), 0, 1e-6));
  const double dropped = 1.0 - kept.to(torch::kDouble).mean().item<double>();
  EXPECT_NEAR(dropped, 0.2, 0.02);  // 33k elements: sd 0.0022
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::where(kept, torch::full({}, scale), torch::zeros({}))));
}

TEST(Dropout, MaskIsAFunctionOfTheCpuGeneratorStateWhichItAdvances) {
  auto x = torch::ones({1000});
  torch::manual_seed(5);
  auto state = at::detail::getDefaultCPUGenerator().get_state();
  auto a = dropout(x, 0.5, true, DropoutImpl::kPhilox);
  auto b = dropout(x, 0.5, true, DropoutImpl::kPhilox);
  EXPECT_FALSE(torch::equal(a, b)) << "each call must draw a new key";
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  gen.set_state(state);
  EXPECT_TRUE(torch::equal(dropout(x, 0.5, true, DropoutImpl::kPhilox), a)) << "same generator state, same mask";
  EXPECT_TRUE(torch::equal(dropout(x, 0.5, true, DropoutImpl::kPhilox), b));
}

TEST(Dropout, TorchImplIsLibTorchsDropoutAndEvalIsIdentity) {
  auto x = torch::randn({32, 33});
  torch::manual_seed(9);
  auto ours = dropout(x, 0.3, true, DropoutImpl::kTorch);
  torch::manual_seed(9);
  auto theirs = torch::nn::functional::dropout(x, torch::nn::functional::DropoutFuncOptions().p(0.3).training(true));
  EXPECT_TRUE(torch::equal(ours, theirs));
  EXPECT_TRUE(dropout(x, 0.3, /*training=*/false, DropoutImpl::kPhilox).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, DropoutImpl::kPhilox).is_same(x));
}

TEST(Dropout, KeepsBFloat16InputsInBFloat16) {
  auto x = torch::randn({8, 40}).to(torch::kBFloat16);
  auto y = dropout(x, 0.1, true, DropoutImpl::kPhilox);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(y.sizes(), x.sizes());
}

}  // namespace
}  // namespace retrace::model
