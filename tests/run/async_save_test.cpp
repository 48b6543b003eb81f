// The background save's parts (src/run/async_save.h): the staging buffer, the check of a staged
// copy against its step's digests, and a save on the writer thread whose shard is byte for byte
// the synchronous save's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/error.h"
#include "run/async_save.h"
#include "testing/temp_dir.h"
#include "train/step_digests.h"

namespace retrace::run {
namespace {

namespace fsys = std::filesystem;

using testing::TempDir;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ckpt::StateSnapshot a_state(uint64_t step, float shift) {
  ckpt::StateSnapshot s;
  s.step = step;
  s.model = {{"fc.bias", torch::arange(8, torch::kFloat32) + shift},
             {"fc.weight", torch::linspace(-1, 1, 96).reshape({8, 12}) * (1 + shift)}};
  s.optim = {{"fc.bias/exp_avg", torch::full({8}, 0.25f + shift)},
             {"fc.weight/exp_avg", torch::linspace(0, 3, 96).reshape({8, 12})}};
  s.rng = "rng state of step " + std::to_string(step);
  s.config_hash = "cafe";
  s.metadata = {{"epoch", "0"}, {"batch_in_epoch", std::to_string(step)}, {"samples_seen", "64"}, {"optim", "adamw"}};
  return s;
}

// What the trace would hold for the state: its digests and each tensor's share.
StepProof proof_of(const ckpt::StateSnapshot& s, DigestKind kind) {
  StepProof p;
  p.step = s.step;
  p.kind = kind;
  p.param = digest_named(s.model, kind, nullptr, &p.parts.model);
  p.optim = digest_named(s.optim, kind, nullptr, &p.parts.optim);
  p.parts.step = s.step;
  p.parts.with_optimizer = true;
  p.rng = train::rng_digest(s.rng);
  return p;
}

SaveOutcome save_on_writer(const ckpt::StateSnapshot& staged, const StepProof& proof, const std::string& root) {
  BackgroundSave writer;
  BackgroundSave::Job job;
  job.snapshot = staged;
  job.root = root;
  job.keep_last = 3;
  job.proof = proof;
  writer.start(std::move(job));
  EXPECT_TRUE(writer.in_flight());
  return *writer.wait();
}

TEST(AsyncSave, TheShardOfABackgroundSaveIsTheSynchronousSavesByteForByte) {
  TempDir sync_root, async_root;
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  const std::string sync_dir = ckpt::save_snapshot(live, sync_root.path(), {}, 3);
  StagingBuffer staging;
  const ckpt::StateSnapshot staged = staging.stage(live);
  EXPECT_EQ(staging.bytes(), uint64_t{(8 + 96) * 4 * 2});
  const SaveOutcome out = save_on_writer(staged, proof_of(live, DigestKind::kLanes), async_root.path());
  ASSERT_FALSE(out.error);
  EXPECT_EQ(out.step, 10u);
  EXPECT_EQ(fsys::path(out.dir).filename(), fsys::path(sync_dir).filename());
  const std::string shard = "/" + ckpt::shard_file_name(0);
  const std::string a = file_bytes(sync_dir + shard), b = file_bytes(out.dir + shard);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_TRUE(fsys::exists(out.dir + "/manifest.json"));
}

TEST(AsyncSave, TheStagingBufferIsReusedAndHoldsTheLatestValues) {
  StagingBuffer staging;
  const ckpt::StateSnapshot first = staging.stage(a_state(10, 0.5f));
  const void* where = first.model[1].second.data_ptr();
  const ckpt::StateSnapshot live = a_state(20, 2.0f);
  const ckpt::StateSnapshot second = staging.stage(live);
  EXPECT_EQ(second.model[1].second.data_ptr(), where);  // no fresh pages per save
  EXPECT_TRUE(torch::equal(second.model[1].second, live.model[1].second));
  EXPECT_NE(second.model[1].second.data_ptr(), live.model[1].second.data_ptr());
  EXPECT_EQ(second.step, 20u);
  EXPECT_EQ(second.rng, live.rng);
  // Another shape: the buffer makes a tensor of the new shape.
  ckpt::StateSnapshot wider = a_state(30, 1.0f);
  wider.model[1].second = torch::ones({8, 13});
  const ckpt::StateSnapshot third = staging.stage(wider);
  EXPECT_EQ(third.model[1].second.sizes(), (std::vector<int64_t>{8, 13}));
}

TEST(AsyncSave, EveryDigestKindChecksAnUntouchedCopy) {
  for (DigestKind kind : {DigestKind::kXxh3, DigestKind::kLanes, DigestKind::kMixed, DigestKind::kMixed4}) {
    StagingBuffer staging;
    const ckpt::StateSnapshot live = a_state(10, 0.5f);
    EXPECT_NO_THROW(check_staged(staging.stage(live), proof_of(live, kind), "here")) << static_cast<int>(kind);
  }
}

TEST(AsyncSave, AFlippedBitInTheStagingCopyNamesTheTensorAndCommitsNothing) {
  TempDir root;
  const ckpt::StateSnapshot older = a_state(10, 0.5f);
  ckpt::save_snapshot(older, root.path(), {}, 3);
  const std::string latest = file_bytes(root.path() + "/LATEST");
  for (const std::string tensor : {"optim/fc.weight/exp_avg", "model/fc.bias"}) {
    StagingBuffer staging;
    const ckpt::StateSnapshot live = a_state(20, 1.0f);
    ckpt::StateSnapshot staged = staging.stage(live);
    corrupt_staged(staged, tensor);
    const SaveOutcome out = save_on_writer(staged, proof_of(live, DigestKind::kLanes), root.path());
    ASSERT_TRUE(out.error);
    EXPECT_FALSE(out.disk_error);
    try {
      std::rethrow_exception(out.error);
    } catch (const IntegrityError& e) {
      EXPECT_NE(std::string(e.what()).find("staged copy of " + tensor + " differs"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(out.dir.empty());
    EXPECT_FALSE(fsys::exists(root.path() + "/" + ckpt::step_dir_name(20) + "/manifest.json"));
    EXPECT_EQ(file_bytes(root.path() + "/LATEST"), latest);
  }
}

TEST(AsyncSave, AnotherRngStateIsCaught) {
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  StepProof proof = proof_of(live, DigestKind::kLanes);
  ckpt::StateSnapshot staged = StagingBuffer().stage(live);
  staged.rng[0] ^= 1;
  EXPECT_THROW(check_staged(staged, proof, "here"), IntegrityError);
}

TEST(AsyncSave, AnOptimizerTheRecordDidNotDigestIsNotChecked) {
  const ckpt::StateSnapshot live = a_state(10, 0.5f);
  StepProof proof = proof_of(live, DigestKind::kLanes);
  proof.parts.with_optimizer = false;  // trace.optimizer_digest_every > 1 and not this step
  ckpt::StateSnapshot staged = StagingBuffer().stage(live);
  corrupt_staged(staged, "optim/fc.bias/exp_avg");
  EXPECT_NO_THROW(check_staged(staged, proof, "here"));
  corrupt_staged(staged, "model/fc.weight");
  EXPECT_THROW(check_staged(staged, proof, "here"), IntegrityError);
}

TEST(AsyncSave, CorruptStagingOfATensorTheCheckpointLacksIsAConfigError) {
  ckpt::StateSnapshot staged = StagingBuffer().stage(a_state(10, 0.5f));
  try {
    corrupt_staged(staged, "model/fc2.weight");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model/fc.weight"), std::string::npos) << e.what();
  }
}

TEST(AsyncSave, ADigestPartNamesItsTensorAndThePartsDoNotChangeTheDigest) {
  const ckpt::StateSnapshot s = a_state(10, 0.5f);
  DigestParts parts;
  EXPECT_EQ(digest_named(s.model, DigestKind::kLanes, nullptr, &parts), digest_named(s.model, DigestKind::kLanes));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].first, "fc.bias");
  EXPECT_NE(parts[0].second, parts[1].second);
}

}  // namespace
}  // namespace retrace::run
