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

// Other generators (a Python loop's) make format version 2; without them the bytes are version 1's,
// so every earlier state and digest stays as it was.
TEST(RngState, OtherGeneratorsAreVersionTwoAndOnlyThen) {
  seed_cpu_and_device(5, -1);
  RngState s = capture_torch(5, -1);
  const std::string v1 = s.serialize();
  EXPECT_EQ(static_cast<uint8_t>(v1[8]), 1u);  // the version word after the magic
  s.generators = {{"numpy.global", std::string(40, '\x02')}, {"python.random", std::string("\x00\x01", 2)}};
  const std::string v2 = s.serialize();
  EXPECT_EQ(static_cast<uint8_t>(v2[8]), 2u);
  const RngState t = RngState::deserialize(v2);
  EXPECT_EQ(t.generators, s.generators);
  EXPECT_EQ(t.serialize(), v2);
  EXPECT_EQ(v2.substr(16, v1.size() - 16), v1.substr(16));  // version 1's fields, then the generators
  EXPECT_TRUE(RngState::deserialize(v1).generators.empty());
  // Hostile version-2 bytes: cut anywhere, unsorted or repeated names, a count of none.
  for (size_t cut = v1.size(); cut < v2.size(); cut += 7)
    EXPECT_THROW(RngState::deserialize(v2.substr(0, cut)), FormatError) << cut;
  RngState unsorted = s;
  std::swap(unsorted.generators[0], unsorted.generators[1]);
  EXPECT_THROW(RngState::deserialize(unsorted.serialize()), FormatError);
  std::string none = v1;
  none[8] = 2;
  EXPECT_THROW(RngState::deserialize(none + std::string(8, '\0')), FormatError);
  std::string v3 = v1;
  v3[8] = 3;
  EXPECT_THROW(RngState::deserialize(v3), FormatError);
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
