// The position-mixed sums computed with torch's ops where a tensor lives (the device code path)
// against the C++ loop over the same bytes (digest.h), here on the CPU; tests/gpu checks CUDA.
#include "core/tensor_digest.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/digest.h"
#include "core/error.h"

namespace retrace {
namespace {

uint64_t host_sum(const torch::Tensor& t, uint64_t first, Mix mix = Mix::kFmix64) {
  const torch::Tensor c = t.contiguous();
  return mixed_sum(c.data_ptr(), c.element_size(), static_cast<uint64_t>(c.numel()), first, mix);
}

TEST(MixedSumOnDevice, TorchOpsGiveTheLoopsSumsForEveryDtype) {
  torch::manual_seed(5);
  const torch::Tensor f = torch::randn({3, 1000}) * 1e3;
  const std::vector<torch::Tensor> tensors = {
      f,
      f.to(torch::kDouble),
      f.to(torch::kBFloat16),
      f.to(torch::kHalf),
      torch::randn({999}, torch::kDouble).view(torch::kInt64),  // 64-bit words of every kind
      torch::randint(-30000, 30000, {777}, torch::kInt16),
      torch::randint(0, 255, {333}, torch::kUInt8),
      torch::randint(-100, 100, {333}, torch::kInt8),
      f > 0,
      -f.abs(),  // every sign bit set: the signed views must be zero-extended
  };
  for (const auto& t : tensors)
    for (uint64_t first : {uint64_t{0}, uint64_t{12345}, ~uint64_t{0} - 100})
      for (Mix mix : {Mix::kFmix64, Mix::kHalves})
        EXPECT_EQ(mixed_sum_on_device(t, first, mix), host_sum(t, first, mix))
            << t.scalar_type() << " from " << first << " mix " << int(mix);
  EXPECT_EQ(mixed_sum_on_device(torch::Tensor(), 0), 0u);
  EXPECT_EQ(mixed_sum_on_device(torch::empty({0, 4}), 9), 0u);
}

TEST(MixedSumOnDevice, ChunksStridesAndSlicesAddUp) {
  torch::manual_seed(6);
  // More than one 1M-element chunk, a transposed (strided) tensor read in row-major order.
  const torch::Tensor big = torch::randn({(1 << 20) + 4099});
  EXPECT_EQ(mixed_sum_on_device(big), host_sum(big, 0));
  const torch::Tensor t = torch::randn({64, 33}).t();
  EXPECT_EQ(mixed_sum_on_device(t), host_sum(t, 0));
  // Ranges of the flat tensor, as ranks hold them, add up to the whole.
  const torch::Tensor flat = big.view({-1});
  const int64_t n = flat.numel(), cuts[4] = {0, 1000, (1 << 20) + 17, n};
  uint64_t sum = 0;
  for (int i = 0; i < 3; ++i)
    sum += mixed_sum_on_device(flat.narrow(0, cuts[i], cuts[i + 1] - cuts[i]), static_cast<uint64_t>(cuts[i]));
  EXPECT_EQ(sum, mixed_sum_on_device(big));
  // The same with version 4's mix.
  EXPECT_EQ(mixed_sum_on_device(big, 0, Mix::kHalves), host_sum(big, 0, Mix::kHalves));
  uint64_t sum4 = 0;
  for (int i = 0; i < 3; ++i)
    sum4 += mixed_sum_on_device(flat.narrow(0, cuts[i], cuts[i + 1] - cuts[i]), static_cast<uint64_t>(cuts[i]),
                                Mix::kHalves);
  EXPECT_EQ(sum4, mixed_sum_on_device(big, 0, Mix::kHalves));
  // A changed element changes it.
  torch::Tensor changed = big.clone();
  changed[777] = std::nextafter(changed[777].item<float>(), 1e9f);
  EXPECT_NE(mixed_sum_on_device(changed), mixed_sum_on_device(big));
}

}  // namespace
}  // namespace retrace
