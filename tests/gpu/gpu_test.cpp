// CUDA checks, labelled `gpu` in ctest: each skips with a visible message where no CUDA device is
// present (or the LibTorch has no CUDA), and runs in full on a GPU machine (tools/gpu/check.sh).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>

#include "core/digest.h"
#include "core/error.h"
#include "core/tensor_digest.h"
#include "core/torch_compat.h"
#include "distributed/process_group.h"
#include "model/activation_checkpoint.h"
#include "rng/rng_state.h"
#include "train/cuda_info.h"

namespace retrace {
namespace {

#define REQUIRE_CUDA()                                                                              \
  do {                                                                                              \
    const train::CudaInfo info = train::cuda_info(0);                                               \
    if (!info.built) GTEST_SKIP() << "LibTorch " << compat::libtorch_version() << " has no CUDA";   \
    if (info.devices == 0)                                                                          \
      GTEST_SKIP() << "no CUDA device on this machine (LibTorch with CUDA " << info.runtime << ")"; \
  } while (0)

const torch::TensorOptions kCuda = torch::TensorOptions().device(torch::kCUDA, 0);

// The CUDA generator's state is its Philox seed and offset: captured, it replays the same draws.
TEST(GpuRng, PhiloxSeedAndOffsetRoundTrip) {
  REQUIRE_CUDA();
  rng::seed_cpu_and_device(1234, 0);
  torch::rand({1000}, kCuda);  // moves the offset
  const rng::RngState s = rng::capture_torch(1234, 0);
  ASSERT_EQ(s.cuda.size(), 1u);
  EXPECT_EQ(s.cuda[0].device_index, 0);
  const torch::Tensor a = torch::rand({4096}, kCuda);
  const torch::Tensor mask_a = torch::dropout(torch::ones({4096}, kCuda), 0.5, true);
  rng::restore_torch(rng::RngState::deserialize(s.serialize()), 0);
  const torch::Tensor b = torch::rand({4096}, kCuda);
  const torch::Tensor mask_b = torch::dropout(torch::ones({4096}, kCuda), 0.5, true);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(mask_a, mask_b));
  EXPECT_FALSE(torch::equal(torch::rand({4096}, kCuda), b));  // and without the restore they differ
  // A CPU run's state has no CUDA generator: a CUDA run refuses it with a message.
  EXPECT_THROW(rng::restore_torch(rng::capture_torch(1, -1), 0), ConfigError);
}

// The position-mixed sums of tensors on the GPU, computed there with torch's int64 ops, equal the
// C++ loop's over the same bytes copied to the host (digest.h), for every element size, across
// chunks and for slices that add up.
TEST(GpuDigest, MixedSumsOnTheDeviceEqualTheHostLoops) {
  REQUIRE_CUDA();
  torch::manual_seed(8);
  const torch::Tensor f = torch::randn({(1 << 20) + 999}, kCuda);
  for (const torch::Tensor& t : {f, f.to(torch::kDouble), f.to(torch::kBFloat16), f > 0, -f.abs()}) {
    const torch::Tensor host = t.cpu().contiguous();
    EXPECT_EQ(mixed_sum_on_device(t, 77), mixed_sum(host.data_ptr(), host.element_size(), host.numel(), 77))
        << t.scalar_type();
  }
  const int64_t cut = 12345;
  EXPECT_EQ(mixed_sum_on_device(f.narrow(0, 0, cut), 0) + mixed_sum_on_device(f.narrow(0, cut, f.numel() - cut), cut),
            mixed_sum_on_device(f, 0));
}

// Activation checkpointing recomputes a segment with the CUDA generator as it was in the forward.
TEST(GpuActivationCheckpoint, DropoutSegmentRecomputesWithTheSameCudaMasks) {
  REQUIRE_CUDA();
  auto run = [](model::CheckpointRng mode, bool checkpointed) {
    rng::seed_cpu_and_device(77, 0);
    torch::nn::Linear fc1(64, 128), fc2(128, 64);
    fc1->to(torch::kCUDA);
    fc2->to(torch::kCUDA);
    torch::Tensor x = torch::randn({32, 64}, kCuda).requires_grad_(true);
    auto seg = [&](const torch::Tensor& in) {
      namespace F = torch::nn::functional;
      return fc2->forward(F::dropout(torch::gelu(fc1->forward(in)), F::DropoutFuncOptions().p(0.5).training(true)));
    };
    torch::Tensor out = checkpointed ? model::checkpoint(seg, x, mode) : seg(x);
    out.pow(2).sum().backward();
    return std::make_pair(x.grad().cpu(), fc1->weight.grad().cpu());
  };
  const auto plain = run(model::CheckpointRng::kRestore, false);
  const auto ckpt = run(model::CheckpointRng::kRestore, true);
  const auto broken = run(model::CheckpointRng::kDebugSkipRestore, true);
  EXPECT_TRUE(torch::equal(plain.first, ckpt.first));
  EXPECT_TRUE(torch::equal(plain.second, ckpt.second));
  EXPECT_FALSE(torch::equal(plain.first, broken.first));  // the check can fail
}

// NCCL at world size 1: the process group forms on device 0 and its all-reduce is the identity.
TEST(GpuNccl, WorldSizeOneAllReduce) {
  REQUIRE_CUDA();
#if !defined(RETRACE_WITH_NCCL)
  GTEST_SKIP() << "built without NCCL (RETRACE_WITH_NCCL)";
#else
  distributed::DistEnv env;
  env.master_addr = "127.0.0.1";
  env.master_port = static_cast<uint16_t>(29000 + std::rand() % 2000);
  distributed::ProcessGroup pg(env, std::chrono::milliseconds(60000), /*cuda=*/true);
  EXPECT_EQ(pg.backend().rfind("nccl ", 0), 0u) << pg.backend();
  distributed::CollectiveStats stats;
  EXPECT_EQ(pg.allreduce_sum(2.5f, stats), 2.5f);
  EXPECT_EQ(stats.calls, 1u);
#endif
}

// The device fields the fingerprint records on a CUDA run.
TEST(GpuInfo, DeviceModelAndCapabilityAreKnown) {
  REQUIRE_CUDA();
  const train::CudaInfo info = train::cuda_info(0);
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_FALSE(info.capability.empty());
  EXPECT_FALSE(info.runtime.empty());
  std::printf("GPU: %s, capability %s, CUDA %s, cuDNN %s, %d device(s)\n", info.device_name.c_str(),
              info.capability.c_str(), info.runtime.c_str(), info.cudnn.c_str(), info.devices);
}

}  // namespace
}  // namespace retrace
