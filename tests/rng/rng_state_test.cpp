#include "rng/rng_state.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "rng/philox.h"

namespace retrace::rng {
namespace {

TEST(RngState, CpuGeneratorRoundTrip) {
  seed_cpu_and_device(99, -1);
  torch::rand({3});
  RngState s = capture_torch(99, -1);
  torch::Tensor a = torch::rand({1000});
  torch::Tensor mask_a = torch::dropout(torch::ones({1000}), 0.5, true);
  restore_torch(s, -1);
  torch::Tensor b = torch::rand({1000});
  torch::Tensor mask_b = torch::dropout(torch::ones({1000}), 0.5, true);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(mask_a, mask_b));
  // Without the restore the draws differ (the test can fail).
  EXPECT_FALSE(torch::equal(torch::rand({1000}), b));
}

TEST(RngState, SerializeRoundTripKeepsEveryStream) {
  seed_cpu_and_device(5, -1);
  RngState s = capture_torch(5, -1);
  s.cursor = {3, 17};
  s.streams.push_back({"faults", mix_key(5, 1), 12});
  s.cuda.push_back({0, std::string(16, '\x07')});
  std::string bytes = s.serialize();
  RngState t = RngState::deserialize(bytes);
  EXPECT_EQ(t.serialize(), bytes);
  EXPECT_EQ(t.cursor, s.cursor);
  ASSERT_EQ(t.streams.size(), 1u);
  // The named Philox stream continues with the same draws after a round trip.
  PhiloxStream orig(s.streams[0].key, s.streams[0].position), back(t.streams[0].key, t.streams[0].position);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(orig.next_u64(), back.next_u64());
  EXPECT_EQ(t.cuda[0].state, s.cuda[0].state);
}

TEST(RngState, MalformedBytesAreFormatErrors) {
  seed_cpu_and_device(5, -1);
  std::string bytes = capture_torch(5, -1).serialize();
  for (size_t cut : {size_t{0}, size_t{7}, size_t{20}, bytes.size() - 1})
    EXPECT_THROW(RngState::deserialize(bytes.substr(0, cut)), FormatError) << cut;
  EXPECT_THROW(RngState::deserialize(bytes + "x"), FormatError);
}

// A CPU run records only the CPU generator, and restoring it ignores CUDA entries (which older
// versions recorded for every visible GPU): it resumes on a machine without GPUs.
TEST(RngState, CpuRunRecordsOnlyTheCpuGeneratorAndIgnoresCudaEntries) {
  seed_cpu_and_device(1, -1);
  RngState s = capture_torch(1, -1);
  EXPECT_TRUE(s.cuda.empty());
  torch::Tensor a = torch::rand({100});
  s.cuda.push_back({3, "recorded on a GPU machine"});
  EXPECT_NO_THROW(restore_torch(s, -1));
  EXPECT_TRUE(torch::equal(torch::rand({100}), a));
}

TEST(RngState, CudaRunFromACpuStateIsAClearError) {
  seed_cpu_and_device(1, -1);
  RngState s = capture_torch(1, -1);
  try {
    restore_torch(s, 0);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA generator"), std::string::npos) << e.what();
  }
}

// A torch generator state of another length is a FormatError before restore_torch, where
// LibTorch's set_state would throw its own error (an internal error, exit 70).
TEST(RngState, GeneratorStatesOfAnotherSizeAreRefusedBeforeRestoring) {
  RngState s = capture_torch(7, -1);
  EXPECT_NO_THROW(check_restorable(s, -1, "here"));
  for (size_t n : {size_t{0}, size_t{16}, s.cpu_generator.size() - 1, s.cpu_generator.size() + 8}) {
    RngState bad = s;
    bad.cpu_generator.resize(n);
    try {
      check_restorable(RngState::deserialize(bad.serialize()), -1, "shard X");
      ADD_FAILURE() << n << " bytes accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("shard X"), std::string::npos) << e.what();
    }
    // restore_torch checks too (every loader goes through it), and leaves the generator as it was.
    torch::manual_seed(3);
    const torch::Tensor expected = torch::rand({4});
    torch::manual_seed(3);
    EXPECT_THROW(restore_torch(bad, -1), FormatError);
    EXPECT_TRUE(torch::equal(torch::rand({4}), expected)) << n << " bytes moved the generator";
  }
}

}  // namespace
}  // namespace retrace::rng
